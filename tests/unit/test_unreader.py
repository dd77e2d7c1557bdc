"""BufferedUnreader: gunicorn's unreader contract, without copying its buffer per read."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from appliance.frontends.unreader import PIECE, BufferedUnreader


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def test_buffered_bytes_come_out_in_pieces_and_in_order(pair: tuple[socket.socket, ...]) -> None:
    unreader = BufferedUnreader(pair[0])
    body = bytes(range(256)) * 20
    unreader.feed(body)
    assert unreader.buffered == len(body)
    assert unreader.head(4) == body[:4]
    assert unreader.tail(3) == body[-3:]
    out = b""
    while unreader.buffered:
        piece = unreader.read()
        assert 0 < len(piece) <= PIECE
        out += piece
    assert out == body


def test_an_unread_suffix_is_read_again(pair: tuple[socket.socket, ...]) -> None:
    unreader = BufferedUnreader(pair[0])
    unreader.feed(b"GET / HTTP/1.1\r\n\r\nnext")
    data = unreader.read()
    unreader.unread(data[18:])
    assert unreader.read() == b"next"
    unreader.unread(b"other bytes")  # not what was read: kept in front all the same
    assert unreader.read() == b"other bytes"


def test_a_sized_read_waits_for_the_socket(pair: tuple[socket.socket, ...]) -> None:
    left, right = pair
    unreader = BufferedUnreader(left)
    unreader.feed(b"abc")
    right.sendall(b"defgh")
    assert unreader.read(6) == b"abcdef"
    assert unreader.read(2) == b"gh"
    right.close()
    unreader.feed(b"xy")
    assert unreader.read(5) == b"xy"  # the peer closed: what there is
    assert unreader.read() == b""
