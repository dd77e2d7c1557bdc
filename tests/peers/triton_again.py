"""A tritonserver oracle that is started again where it went away mid-test.

Real Triton is the oracle of the differential tests, not their subject, and
tritonserver 2.51 crashed or hung now and then in CI under the Python
backend's BLS calls. :class:`Peer` starts it again for the next test, and
:func:`triton_answers` asks a fresh one once more.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from bench.servers import PeerServer
from tests.peers.conftest import triton_serving
from tests.peers.oracle import Call, answers, transports


class Peer:
    """The module's tritonserver, started again for the next test where it died in one.

    Real Triton is the oracle here, not the subject: once (a CI run, 2026-11-29) its
    BLS call hung and the server went, and every later test of the module failed on a
    refused connection. Started again, only the test it died in fails, and the call-by-
    call comparisons ask it once more (:func:`triton_answers`).
    """

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self._stack = contextlib.ExitStack()
        self._server: PeerServer | None = None

    def live(self) -> PeerServer:
        if self._server is None or self._server.process.poll() is not None:
            self.close()
            # Explicit control (as the appliance is always) with every model loaded at
            # the start; a model that fails to load leaves the server up.
            options = ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"]
            self._server = self._stack.enter_context(triton_serving(self.repository, options))
        return self._server

    def close(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._server = None


# What a gRPC client reads where the server went away, not an answer of its.
GONE = ("Stream removed", "failed to connect to all addresses")


def triton_answers(peer: Peer, transport: str, calls: list[Call]) -> dict[str, Any]:
    """Triton's answers to ``calls``, asked once more of a tritonserver started again
    where it went away while it answered (it exited, a call failed other than with its
    answer, or a gRPC stream broke): its BLS calls crashed or hung tritonserver 2.51
    now and then in CI (model loading from a BLS call, 2026-11-30). Gone twice: fails.
    """
    gone = ""
    for _ in range(2):
        server = peer.live()
        module, url = transports(server.urls)[0 if transport == "http" else 1]
        try:
            found = answers(module, url, calls)
        except Exception as ex:
            gone = f"{type(ex).__name__}: {ex}"
        else:
            broken = [
                n for n, a in found.items() if a[0] == "error" and any(g in a[2] for g in GONE)
            ]
            if not broken and server.process.poll() is None:
                return found
            gone = f"at {broken[:1]}, exit status {server.process.poll()}"
        print(f"tritonserver went away while it answered ({gone}); starting it again")
        peer.close()
    pytest.fail(f"tritonserver went away twice while it answered; the last time: {gone}")
