"""Limits on what a client controls, checked where they are enforced (issue 33's review)."""

from __future__ import annotations

import tracemalloc
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.client.request import check_parameters, request_body
from appliance.core.descriptor import Kind, Message, from_frame, to_frame
from appliance.errors import BadRequest, TooLarge
from appliance.protocols.grps.service import parameters as grps_parameters
from appliance.protocols.kserve import encoding

MiB = 1 << 20


def nested(depth: int) -> Any:
    value: Any = 1
    for index in range(depth):
        value = {"a": value} if index % 2 else [value]
    return value


@pytest.mark.parametrize("wbits", [16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS])
def test_a_decompression_bomb_is_refused_while_it_inflates(wbits: int) -> None:
    """256 MiB of zeros against a 1 MiB limit: memory stays near the limit."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    bomb = b"".join(packer.compress(bytes(MiB)) for _ in range(256)) + packer.flush()
    name = "gzip" if wbits > zlib.MAX_WBITS else "deflate"
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="exceeds the limit of 1048576 bytes"):
            encoding.decode_content(bomb, name, MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB, f"inflating took {peak} bytes"


@pytest.mark.parametrize(
    "parameters",
    [
        {"x": nested(300)},
        {"x": [nested(260)]},
        {"x": 1 << 64},
        {"x": -(1 << 63) - 1},
        {"x": {"y": [1, 2, 1 << 70]}},
    ],
)
def test_parameters_a_descriptor_cannot_carry_are_a_bad_request(parameters: Any) -> None:
    with pytest.raises(BadRequest, match="parameters cannot be passed to the model"):
        request_body("m", "predict", None, parameters, None)


@settings(max_examples=60, deadline=None)
@given(st.integers(200, 300), st.sampled_from([0, 1, (1 << 64) - 1, -(1 << 63), 1 << 64]))
def test_parameters_that_pass_the_check_always_encode(depth: int, number: int) -> None:
    parameters = {"deep": nested(depth), "number": number}
    try:
        check_parameters(parameters)
    except BadRequest:
        return
    body = request_body("m", "predict", ["y"], parameters, None)
    message = from_frame(to_frame(Message(Kind.INFER, 1, 2, body)))
    assert message.body["params"]["number"] == number


def test_grps_query_integers_past_64_bits_stay_text() -> None:
    pairs = [
        ("small", "-9223372036854775808"),
        ("large", "18446744073709551615"),
        ("over", "18446744073709551616"),
        ("under", "-9223372036854775809"),
        ("long", "9" * 5000),  # past int()'s digit limit: a float, as before
    ]
    got = grps_parameters(pairs, ())
    assert got["small"] == -(1 << 63)
    assert got["large"] == (1 << 64) - 1
    assert got["over"] == "18446744073709551616"
    assert got["under"] == "-9223372036854775809"
    check_parameters(got)
