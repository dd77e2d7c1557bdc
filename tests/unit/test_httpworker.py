"""When the HTTP worker's poller hands a request to a thread."""

from __future__ import annotations

from appliance.frontends.httpworker import HEADER_BYTES, PREREAD_BYTES, request_complete

LIMIT = 64 << 20
HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"


def test_headers_without_a_body_are_complete() -> None:
    assert request_complete(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", LIMIT)
    assert not request_complete(b"GET / HTTP/1.1\r\nHost: x\r\n", LIMIT)


def test_a_small_body_must_arrive_whole() -> None:
    request = HEAD + b"Content-Length: 4\r\n\r\n"
    assert not request_complete(request + b"abc", LIMIT)
    assert request_complete(request + b"abcd", LIMIT)
    assert request_complete(HEAD.lower() + b"content-length:4\r\n\r\nabcd", LIMIT)


def test_a_large_body_goes_to_a_thread_after_its_headers() -> None:
    request = HEAD + f"Content-Length: {PREREAD_BYTES * 4}\r\n\r\n".encode()
    assert not request_complete(request + b"x" * (PREREAD_BYTES - 1), LIMIT)
    assert request_complete(request + b"x" * PREREAD_BYTES, LIMIT)


def test_chunked_bodies_end_at_the_last_chunk() -> None:
    request = HEAD + b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"
    assert not request_complete(request, LIMIT)
    assert request_complete(request + b"0\r\n\r\n", LIMIT)


def test_a_client_waiting_for_100_continue_gets_a_thread() -> None:
    assert request_complete(HEAD + b"Expect: 100-continue\r\nContent-Length: 9\r\n\r\n", LIMIT)


def test_oversized_headers_go_to_the_parser_to_be_refused() -> None:
    assert request_complete(HEAD + b"X-Big: " + b"a" * HEADER_BYTES, LIMIT)


def test_a_declared_length_over_the_limit_is_refused_at_once() -> None:
    assert request_complete(HEAD + f"Content-Length: {LIMIT + 1}\r\n\r\n".encode(), LIMIT)
    assert not request_complete(HEAD + f"Content-Length: {LIMIT + 1}\r\n\r\n".encode(), 1 << 30)


def test_a_prefix_with_the_buffers_size_and_tail_says_the_same() -> None:
    # The poller passes the first bytes, the whole size and the last five,
    # so it never copies a large body to ask.
    head = b"POST /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"
    whole = head + b"a" * 1000
    for cut in (len(head) - 1, len(head), len(head) + 999, len(whole)):
        data = whole[:cut]
        prefix = data[:64]
        assert request_complete(prefix, LIMIT, len(data), data[-5:]) == request_complete(
            data, LIMIT
        )
    chunked = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert request_complete(chunked[:60], LIMIT, len(chunked), chunked[-5:])
    assert not request_complete(chunked[:60], LIMIT, len(chunked) - 2, chunked[-7:-2])
