"""The HTTP frontend parses requests with gunicorn's C parser where it is installed."""

from __future__ import annotations

import pytest
from gunicorn.asgi.protocol import ASGIProtocol

from appliance.frontends import httpworker

h1c = pytest.importorskip("gunicorn_h1c", reason="the [fast-http] extra is not installed")


def test_the_worker_connection_gets_the_c_parser() -> None:
    # gunicorn's "auto" parser setting reads these from ASGIProtocol when a
    # connection starts; left unset, every connection of the appliance's
    # subclass falls back to the pure-Python parser.
    assert issubclass(httpworker._Connection, ASGIProtocol)
    assert ASGIProtocol._h1c_available
    assert ASGIProtocol._h1c_has_limits
    assert ASGIProtocol._h1c_protocol_class is h1c.H1CProtocol
