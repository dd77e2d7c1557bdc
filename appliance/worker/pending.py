"""What a model worker holds of a request: the pending request, and what it is part of.

A :class:`Pending` may be a piece of a larger request (:class:`Whole`, see
pieces.py) or a step of a stateful sequence (:class:`Step` of a
:class:`Live` sequence, see sequences.py). They live here, apart from the
modules that act on them, so that batcher.py, pieces.py and sequences.py
each import this one and never each other in a circle.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from appliance.core.descriptor import Message
from appliance.core.device_tensors import CudaPlace
from appliance.core.sequences import SequenceId
from appliance.core.tensor import Tensor

Array = npt.NDArray[Any]


@dataclass(slots=True, init=False)
class Pending:
    """One request waiting in (or running on) a model worker.

    PERF: its ``__init__`` is written out, not generated (see Message): one
    is made for every request.
    """

    message: Message
    arrays: dict[str, Array]
    method: str
    parameters: dict[str, Any]
    outputs: list[str] | None
    rows: int
    key: Hashable | None
    arrived: float
    # Where the inputs lie in shared memory (see passthrough.py).
    spans: list[tuple[int, int, str, int]]
    # Set on a piece of a request over max_batch_size (see pieces.py).
    whole: Whole | None
    index: int
    # Set on a step of a stateful sequence (see sequences.py).
    step: Step | None
    # The request's sequence parameters, kept apart from the model's.
    sequence: dict[str, Any] | None
    # Outputs to write into a client's GPU memory, and those already written
    # there (see cuda_regions.py).
    targets: dict[str, CudaPlace] | None
    written: set[str] | None
    # A traced request's parent span and times (see traces.py).
    trace: Any
    # Its place in a queue with priorities (twice its level, one more once its
    # wait passed a "delay" timeout), and when its wait runs out (0: never).
    rank: int
    expires: float
    delay: bool

    def __init__(
        self,
        message: Message,
        arrays: dict[str, Array],
        method: str,
        parameters: dict[str, Any],
        outputs: list[str] | None,
        rows: int = 0,
        key: Hashable | None = None,
        arrived: float | None = None,
        spans: list[tuple[int, int, str, int]] | None = None,
        whole: Whole | None = None,
        index: int = 0,
        step: Step | None = None,
        sequence: dict[str, Any] | None = None,
        targets: dict[str, CudaPlace] | None = None,
        written: set[str] | None = None,
        trace: Any = None,
        rank: int = 0,
        expires: float = 0.0,
        delay: bool = False,
    ) -> None:
        self.message = message
        self.arrays = arrays
        self.method = method
        self.parameters = parameters
        self.outputs = outputs
        self.rows = rows
        self.key = key
        self.arrived = time.monotonic() if arrived is None else arrived
        self.spans = [] if spans is None else spans
        self.whole = whole
        self.index = index
        self.step = step
        self.sequence = sequence
        self.targets = targets
        self.written = written
        self.trace = trace
        self.rank = rank
        self.expires = expires
        self.delay = delay

    @property
    def request_id(self) -> int:
        return self.message.request_id


@dataclass(slots=True, eq=False)
class Whole:
    """The request that was cut, and what its pieces have produced so far."""

    pending: Pending
    parts: list[dict[str, Tensor] | None] = field(default_factory=list)
    left: int = 0
    failed: bool = False


@dataclass(slots=True, eq=False)
class Live:
    """A live sequence on this instance: its id, slot, state and last step time.

    ``waiting``: started while every "direct" slot was held, it has none yet;
    ``ended``: its end step came while it was waiting.
    """

    id: SequenceId
    slot: int
    state: dict[str, Array]
    last: float
    waiting: bool = False
    ended: bool = False


@dataclass(slots=True)
class Step:
    """What a pending request is within its sequence."""

    live: Live
    start: bool
    end: bool
