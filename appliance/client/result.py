"""InferResult: what a call of the client API answers, views into the worker's response ring.

Apart from inflight.py, which makes results from replies, since everything
that reads a call's outputs (the drivers, the response cache, ensembles,
the protocols) takes a result and needs nothing of the table of calls.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy.typing as npt

from appliance.core.tensor import Tensor


class InferResult:
    """Outputs of one request, as views into the worker's response ring.

    Release it (or use it as a context manager) once the outputs have been
    encoded or copied: the worker reuses the space afterwards.
    """

    __slots__ = ("__weakref__", "_release", "body", "outputs")

    def __init__(
        self, outputs: dict[str, Tensor], release: Any, body: dict[str, Any] | None = None
    ) -> None:
        self.outputs = outputs
        self._release = release
        # The reply's body: where each output lies (an ensemble passes them on from there).
        self.body = body

    def __getitem__(self, name: str) -> Tensor:
        return self.outputs[name]

    def array(self, name: str) -> npt.NDArray[Any]:
        return self.outputs[name].array()

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> InferResult:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()
