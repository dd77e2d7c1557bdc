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


@dataclass(slots=True)
class Pending:
    """One request waiting in (or running on) a model worker."""

    message: Message
    arrays: dict[str, Array]
    method: str
    parameters: dict[str, Any]
    outputs: list[str] | None
    rows: int = 0
    key: Hashable | None = None
    arrived: float = field(default_factory=time.monotonic)
    # Where the inputs lie in shared memory (see passthrough.py).
    spans: list[tuple[int, int, str, int]] = field(default_factory=list)
    # Set on a piece of a request over max_batch_size (see pieces.py).
    whole: Whole | None = None
    index: int = 0
    # Set on a step of a stateful sequence (see sequences.py).
    step: Step | None = None
    # The request's sequence parameters, kept apart from the model's.
    sequence: dict[str, Any] | None = None
    # Outputs to write into a client's GPU memory, and those already written
    # there (see cuda_regions.py).
    targets: dict[str, CudaPlace] | None = None
    written: set[str] | None = None
    # A traced request's parent span and times (see traces.py).
    trace: Any = None
    # Its place in a queue with priorities (twice its level, one more once its
    # wait passed a "delay" timeout), and when its wait runs out (0: never).
    rank: int = 0
    expires: float = 0.0
    delay: bool = False

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
