"""One call of an ensemble in progress: its steps sent and answered, with no copy between them.

A call to an ensemble (ensemble.py) runs its steps from here, each an
ordinary call to its model (routed, batched, counted and timed as any
other). Apart from ensemble.py, which keeps the ensembles served and
answers for them (readiness, counters), since this is the run itself and
the ring space its tensors hold while it lasts.

No intermediate tensor is copied: a step's output above the inline
threshold stays in the response ring of the worker that made it, and the
next step's descriptor points at that block (:class:`Placed`), which its
worker reads in place. An ensemble input read by several steps is written
once into this process's request ring and sent by reference to each. A
step that passes a tensor through (identity, a reshape) answers with a
reference to the very block it read, so a chain of such steps moves one
descriptor and never a byte.

Each tensor lies in something that must outlive it: a step's result, or
blocks of this process's ring. A :class:`_Holder` counts the tensors' uses
(each step that reads one, and the ensemble's own result for an output)
and gives the space back when the last use ends: when the last reader has
answered, when the caller releases the ensemble's result, or, for a step
given up on (a deadline, a failure elsewhere), once its worker replied late
or died (InFlight's ``after``), since it may still be reading.

Steps whose inputs are ready are sent together, so the branches of a DAG
run at once on their workers; replies are taken in the order sent. A step
that fails fails the request, its error naming the step and its model.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.client.call import Call, Outbox
from appliance.client.drive import Pick, Steps
from appliance.client.ensemble_plan import Plan
from appliance.client.inflight import InFlight
from appliance.client.request import TensorLike, TensorOf, request_body, tensor_of
from appliance.client.result import InferResult
from appliance.core.client_memory import ClientTensor
from appliance.core.message_tensors import Placed
from appliance.core.ring import Block
from appliance.core.tensor import Tensor, TensorSpec
from appliance.errors import (
    ApplianceError,
    BadRequest,
    DeadlineExceeded,
    ErrorCode,
    ModelNotFound,
    ModelNotReady,
    error_from_code,
)
from appliance.observability import tracing
from appliance.observability.metrics import record_call


class _Holder:
    """What some of an ensemble's tensors lie in; given back when its last use ends."""

    __slots__ = ("_lock", "_release", "uses")

    def __init__(self, lock: threading.Lock, release: Callable[[], None] | None) -> None:
        self._lock = lock
        self._release = release
        self.uses = 0

    def take(self, count: int) -> None:
        with self._lock:
            self.uses += count

    def drop(self) -> None:
        with self._lock:
            self.uses -= 1
            release = self._release if self.uses <= 0 else None
            if release is not None:
                self._release = None
        if release is not None:
            release()

    def unused(self) -> None:
        """Give it back now if no tensor took a use of it."""
        with self._lock:
            release = self._release if self.uses <= 0 else None
            self._release = None if release is not None else self._release
        if release is not None:
            release()


@dataclass(slots=True)
class _Value:
    """An ensemble tensor: as read here, as sent to a step, and what it lies in."""

    tensor: TensorOf
    sent: TensorOf
    holder: _Holder | None


class EnsembleRun:
    """One call of an ensemble in progress.

    Args:
        flight: the client's requests in flight and its ring.
        pick: chooses a step's instance (ModelClient._pick).
        inline: tensors up to this size ride in the message.
        plan: the ensemble's plan (ensemble_plan.py).
    """

    def __init__(
        self,
        flight: InFlight,
        pick: Pick,
        inline: int,
        plan: Plan,
        channel: Outbox,
        parameters: Mapping[str, Any] | None,
        deadline: float,
        trace: tracing.CallTrace | None = None,
    ) -> None:
        self._flight = flight
        self._pick = pick
        self._inline = inline
        self.plan = plan
        self.channel = channel
        self.parameters = parameters
        self.deadline = deadline
        self.values: dict[str, _Value] = {}
        self.trace = trace
        self._step_traces: dict[int, tracing.StepTrace] = {}
        # Holders are given back from other threads too (a late reply of a
        # step given up on); one lock for the run is enough.
        self._lock = threading.Lock()

    def steps(
        self, inputs: Mapping[str, TensorLike], wanted: Sequence[str] | None
    ) -> Steps[InferResult]:
        plan = self.plan
        finals = self._finals(wanted)
        waiting = list(plan.order)
        flying: deque[tuple[int, Call, float]] = deque()
        try:
            self._take_inputs(inputs, finals)
            while waiting or flying:
                for index in [i for i in waiting if self._can_send(i)]:
                    started = time.perf_counter()
                    call = yield from self._send(index)
                    # Not before: a step whose send failed still holds its inputs.
                    waiting.remove(index)
                    flying.append((index, call, started))
                index, call, started = flying[0]
                yield call
                flying.popleft()  # not before: a run closed at the yield still owns it
                self._receive(index, call, started, finals)
            return self._result(finals)
        except BaseException:
            for index, call, _started in flying:
                self._flight.finish(call, False)  # its inputs go once its worker is done
                self._step_ended(index, "the ensemble call ended before this step answered")
            for index in waiting:
                self._done(index)
            for name in finals:
                value = self.values.get(name)
                if value is not None and value.holder is not None:
                    value.holder.drop()
            raise

    def _finals(self, wanted: Sequence[str] | None) -> list[str]:
        declared = [name for name, _dtype, _shape in self.plan.config.outputs]
        if wanted is None:
            return declared
        for name in wanted:
            if name not in declared:
                raise BadRequest(
                    f"ensemble {self.plan.config.name} has no output named {name!r}; "
                    f"its outputs are {', '.join(declared)}"
                )
        return list(dict.fromkeys(wanted))

    def _take_inputs(self, inputs: Mapping[str, TensorLike], finals: list[str]) -> None:
        """Check the ensemble's inputs; write each one several steps read into the ring once."""
        metadata = self.plan.metadata
        assert metadata.inputs is not None
        name = metadata.name
        for given in inputs:
            if metadata.input(given) is None:
                raise BadRequest(
                    f"ensemble {name} has no input named {given!r}; its inputs are "
                    f"{', '.join(spec.name for spec in metadata.inputs)}"
                )
        rows = set()
        for spec in metadata.inputs:
            raw = inputs.get(spec.name)
            if raw is None:
                raise BadRequest(f"ensemble {name}: missing input {spec.name!r}")
            tensor = tensor_of(spec.name, raw)
            _check(name, spec, tensor)
            if metadata.max_batch_size > 0 and tensor.shape:
                rows.add(tensor.shape[0])
            readers = self.plan.readers[spec.name]
            # A step reads the tensor from where it lies; one read by several
            # is written into the ring once, for all of them.
            shared = isinstance(tensor, Tensor | ClientTensor) and tensor.nbytes > self._inline
            if readers > 1 and shared:
                assert isinstance(tensor, Tensor | ClientTensor)
                placed = self._flight.place(tensor)
                release = functools.partial(self._flight.release_placed, placed)
                holder = _Holder(self._lock, release)
                holder.take(readers)
                self.values[spec.name] = _Value(tensor, placed, holder)
                continue
            self.values[spec.name] = _Value(tensor, tensor, None)
        if len(rows) > 1 or (rows and max(rows) > metadata.max_batch_size):
            raise BadRequest(
                f"ensemble {name}: inputs of {sorted(rows)} rows; they must agree on the batch "
                f"size (first dimension), at most its max_batch_size {metadata.max_batch_size}"
            )

    def _can_send(self, index: int) -> bool:
        return all(t in self.values for t in self.plan.config.steps[index].input_map.values())

    def _send(self, index: int) -> Steps[Call]:
        step = self.plan.config.steps[index]
        try:
            timeout_s = None
            if self.deadline:
                timeout_s = self.deadline - time.monotonic()
                if timeout_s <= 0:
                    raise DeadlineExceeded("the request's deadline passed before this step began")
            body = request_body(
                step.model, "predict", self.plan.wanted[index], self.parameters, None
            )
            target, _deadline = yield from self._pick(step.model, timeout_s, body.get("params"))
            inputs = {name: self.values[tensor].sent for name, tensor in step.input_map.items()}
            if self.trace is not None:
                self._step_traces[index], body["trace"] = self.trace.step(step.model, index)
            call = self._flight.send(self.channel, target, self.deadline, body, inputs)
        except ApplianceError as ex:
            self._step_ended(index, ex.message)
            raise self._failed(index, ex) from None
        call.after = functools.partial(self._done, index)
        return call

    def _receive(self, index: int, call: Call, started: float, finals: list[str]) -> None:
        """Take a step's reply: its outputs become ensemble tensors, its inputs are done with."""
        step = self.plan.config.steps[index]
        answered = call.reply is not None
        try:
            result = self._flight.settle(call)
        except ApplianceError as ex:
            record_call(step.model, ex.code, started)
            self._step_ended(index, ex.message)
            if answered:
                self._done(index)
            raise self._failed(index, ex) from None
        except BaseException:
            self._step_ended(index, "the ensemble call ended before this step answered")
            if answered:
                self._done(index)
            raise
        record_call(step.model, ErrorCode.OK, started)
        self._step_ended(index)
        holder = _Holder(self._lock, result.release)
        body = result.body or {}
        places = {entry[0]: entry[3] for entry in body.get("tensors", ()) if type(entry[3]) is list}
        borrowed = body.get("borrowed") or ()
        readers = self.plan.readers
        try:
            for output, tensor_name in step.output_map.items():
                uses = readers.get(tensor_name, 0) + (tensor_name in finals)
                if not uses:
                    continue
                tensor = result.outputs.get(output)
                if tensor is None:
                    raise self._failed(index, BadRequest(f"it did not produce output {output!r}"))
                place = places.get(output)
                owner = (self._lender(index, place) if output in borrowed else None) or holder
                sent: TensorOf = tensor
                if place is not None:
                    sent = Placed(tensor.dtype, tuple(tensor.shape), Block(*place))
                owner.take(uses)
                self.values[tensor_name] = _Value(tensor, sent, owner)
        finally:
            # Outputs took their uses first: a step that passed an input
            # through keeps that input's block alive past its own use.
            self._done(index)
            holder.unused()

    def _lender(self, index: int, place: list[Any] | None) -> _Holder | None:
        """The holder of the step input an output passed through lies in, if one of ours."""
        if place is None:
            return None
        segment, offset, nbytes = place
        for tensor in self.plan.config.steps[index].input_map.values():
            value = self.values[tensor]
            if type(value.sent) is Placed:
                block = value.sent.block
                inside = block.offset <= offset and offset + nbytes <= block.offset + block.nbytes
                if block.segment == segment and inside:
                    return value.holder
        return None

    def _step_ended(self, index: int, error: str = "") -> None:
        """End a traced step's span (once: a step's failure can pass here twice)."""
        traced = self._step_traces.pop(index, None)
        if traced is not None:
            traced.end(error)

    def _done(self, index: int) -> None:
        """A step no longer reads its inputs (it answered, or its worker is done or dead)."""
        for tensor in self.plan.config.steps[index].input_map.values():
            value = self.values.get(tensor)
            if value is not None and value.holder is not None:
                value.holder.drop()

    def _result(self, finals: list[str]) -> InferResult:
        chosen = [self.values[name] for name in finals]
        outputs: dict[str, Tensor] = {}
        for name, value in zip(finals, chosen, strict=True):
            assert isinstance(value.tensor, Tensor)  # made by a step (ensembles.order)
            outputs[name] = value.tensor
        holders = [value.holder for value in chosen if value.holder is not None]
        if not holders:
            return InferResult(outputs, None)

        def release() -> None:
            for holder in holders:
                holder.drop()

        return InferResult(outputs, release)

    def _failed(self, index: int, error: ApplianceError) -> ApplianceError:
        """A step's error as the ensemble's: the same kind, naming the step and its model."""
        step = self.plan.config.steps[index]
        code = error.code
        # The ensemble is there; a step's model that is not is why it is not ready.
        if isinstance(error, ModelNotFound):
            code = ModelNotReady.code
        message = (
            f"ensemble {self.plan.config.name}, step {index} (model {step.model}): {error.message}"
        )
        return error_from_code(code, message)


def _check(name: str, spec: TensorSpec, tensor: TensorOf) -> None:
    if isinstance(tensor, Placed):  # not from a caller
        return
    if tensor.dtype is not spec.dtype:
        raise BadRequest(
            f"ensemble {name} input {spec.name}: expected datatype {spec.dtype.value}, "
            f"got {tensor.dtype.value}"
        )
    if not spec.matches_shape(tuple(tensor.shape)):
        raise BadRequest(
            f"ensemble {name} input {spec.name}: shape {list(tensor.shape)} does not match the "
            f"declared shape {list(spec.shape)} (-1 means any size)"
        )
