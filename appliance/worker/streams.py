"""A streaming model's open streams (``predict_stream``; Triton's decoupled models).

Each turn of the worker's loop takes one part of every open stream, so
streams share the instance with one another and with the batches between
them; the worker sends each part as it comes and the end (or the error)
once a stream stops. A stream whose client cancelled it, or went away, is
closed: its generator's ``close`` lets the model stop early.

A stream whose reader fell behind (a slow client: its frontend holds as many
of its parts as it will, see appliance/client/channel.py) is paused: its
generator is not advanced, so the model makes no more of it, until the
frontend asks for more. The other streams and the batches go on meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import carried
from appliance.core.status import StatusTable
from appliance.core.tensor import Tensor
from appliance.model import Model
from appliance.worker import methods
from appliance.worker.pending import Pending
from appliance.worker.per_request import request_of
from appliance.worker.sequences import Sequences

log = logging.getLogger("appliance.worker")

# What one step of a stream brought: its next part's outputs, None at its
# end, or what the model raised.
Step = dict[str, Tensor] | Exception | None


@dataclass(slots=True)
class Stream:
    pending: Pending
    parts: Iterator[Any]
    paused: bool = False


class Streams:
    """The open streams of one model instance."""

    def __init__(
        self,
        model: Model,
        metadata: ModelMetadata,
        status: StatusTable,
        slot: int,
        sequences: Sequences | None = None,
    ) -> None:
        self.model = model
        self.metadata = metadata
        self.status = status
        self.slot = slot
        # A decoupled sequence model's: each stream is a step of a sequence.
        self.sequences = sequences
        self._open: list[Stream] = []
        self._paused = 0

    def __len__(self) -> int:
        return len(self._open)

    @property
    def running(self) -> bool:
        """Whether any open stream is to be stepped (is not paused)."""
        return len(self._open) > self._paused

    def __iter__(self) -> Iterator[Stream]:
        return iter(list(self._open))

    def start(self, pending: Pending) -> None:
        """Open ``pending``'s stream; raises what the model's predict_stream raised."""
        request = request_of(pending, self.metadata.name, None, self.sequences)
        parts = iter(self.model.predict_stream_request(request))
        self._open.append(Stream(pending, parts))

    def pause(self, pid: int, request_id: int, paused: bool) -> None:
        """Pause (or go on with) the stream of client ``pid``'s ``request_id``, if still open."""
        for stream in self._open:
            if stream.pending.request_id == request_id and stream.pending.message.pid == pid:
                if stream.paused != paused:
                    stream.paused = paused
                    self._paused += 1 if paused else -1
                return

    def step(self) -> Iterator[tuple[Stream, Step]]:
        """One step of every open stream not paused, in the order they opened."""
        for stream in list(self._open):
            if stream.paused:
                continue
            self.status.beat(self.slot, busy_since=time.monotonic())  # for the hang watchdog
            try:
                part = next(stream.parts)
                outputs = methods.stream_part(self.metadata, part)
                wanted = stream.pending.outputs
                if wanted is not None:
                    # As for a unary reply: only what the client asked for.
                    outputs = carried(outputs, {n: t for n, t in outputs.items() if n in wanted})
            except StopIteration:
                yield stream, None
                continue
            except Exception as ex:
                yield stream, ex
                continue
            yield stream, outputs
        self.status.beat(self.slot)

    def close(self, stream: Stream) -> None:
        """Forget ``stream`` and let its generator finish (a model may clean up there)."""
        self._open.remove(stream)
        if stream.paused:
            self._paused -= 1
        close = getattr(stream.parts, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log.exception("closing the stream of model %s failed", self.metadata.name)
