"""TorchServe's reply frame (what its own send_intermediate_predict_response writes),
read back into each request's answer."""

from __future__ import annotations

import struct

import pytest

from appliance.runtimes.torchserve_io import read_frame


def _chunk(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def _frame(*answers: tuple[bytes, str, int, str, dict[str, str]]) -> bytes:
    frame = struct.pack("!i", 200) + _chunk(b"Intermediate Prediction success")
    for body, content_type, status, reason, headers in answers:
        frame += _chunk(b"request-id") + _chunk(content_type.encode())
        frame += struct.pack("!i", status) + _chunk(reason.encode())
        frame += struct.pack("!i", len(headers))
        for key, value in headers.items():
            frame += _chunk(key.encode()) + _chunk(value.encode())
        frame += _chunk(body)
    return frame + struct.pack("!i", -1)


def test_each_request_s_answer_is_read_back() -> None:
    answers = [
        (b"part0 ", "", 200, "", {"ts_stream_next": "true"}),
        (b"\x00\x01", "application/octet-stream", 201, "Made", {"x-a": "1", "x-b": "2"}),
    ]
    assert read_frame(_frame(*answers)) == answers


def test_a_frame_cut_short_is_refused() -> None:
    frame = _frame((b"body", "", 200, "", {}))
    with pytest.raises(ValueError, match="cut short"):
        read_frame(frame[:-8])
