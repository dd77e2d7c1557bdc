"""UM-Bridge's endpoints on top of the model client, free of any web framework.

Each method takes a decoded request and returns the reply body; the model
calls (Evaluate and the derivatives) are coroutines that wait for the model
in the event loop. The checks run in the order UM-Bridge's servers and its
conformity suite expect (SPEC: PROTOCOL-FACTS §5.1, §5.3):

    1. the model name               400 ModelNotFound
    2. the endpoint's support flag  400 UnsupportedFeature, before any other field
    3. config, input vectors, outWrt/inWrt, sens/vec   400 InvalidInput
    4. the model's result sizes     500 InvalidOutput

A request that names no model (an empty body) addresses the first model
/Info lists, as the conformity suite's models[0] does; so an empty POST to an
endpoint that model lacks still gets UnsupportedFeature.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from appliance.client.api import ModelClient
from appliance.core.metadata import ModelMetadata
from appliance.errors import ModelNotFound, ModelNotReady
from appliance.protocols.umbridge import shm
from appliance.protocols.umbridge.codec import (
    METHODS,
    Feature,
    Interface,
    Unmappable,
    Vector,
    derivative_vector,
    encode_info,
    encode_model_info,
    encode_outputs,
    encode_sizes,
    encode_vector,
    interface_of,
    output_vectors,
    read_config,
    read_index,
    read_inputs,
    read_name,
    read_vector,
    to_model_inputs,
)
from appliance.protocols.umbridge.errors import model_not_found, unsupported_feature

EMPTY_REPLY = b"{}"


@dataclass(frozen=True, slots=True)
class Wrt:
    """What a derivative request differentiates, and its vectors."""

    out_wrt: int
    in_wrt: int
    in_wrt2: int | None = None
    sens: Vector | None = None
    vec: Vector | None = None


@dataclass(frozen=True, slots=True)
class _Call:
    """A model call's request, read and checked."""

    iface: Interface
    config: dict[str, Any] | None
    channel: shm.Channel | None  # vectors travel in shared memory
    vectors: list[Vector]

    def reply(self, outputs: list[Vector], encode: Callable[[list[Vector]], bytes]) -> bytes:
        """The reply: ``outputs`` encoded, or {} with them written to shared memory."""
        if self.channel is None:
            return encode(outputs)
        self.channel.write_outputs(outputs)
        return EMPTY_REPLY


class Bridge:
    """Serve UM-Bridge requests through one :class:`ModelClient`."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._interfaces: dict[str, tuple[ModelMetadata, Interface | str]] = {}

    # -- which models, and how they look ----------------------------------------

    def listed(self) -> list[str]:
        """Return the models served over UM-Bridge, in config order.

        A model is left out while it has not loaded (its interface is not
        known yet) and for good when it cannot be mapped (generic, BYTES,
        free sizes).
        """
        names = []
        for name in self.client.models():
            try:
                mapped = self._mapped(name)
            except (ModelNotFound, ModelNotReady):
                continue
            if isinstance(mapped, Interface):
                names.append(name)
        return names

    def interface(self, name: str) -> Interface:
        """Return a listed model's interface.

        Raises:
            UmBridgeError: ModelNotFound, unknown or not mappable.
            ModelNotReady: the model has not loaded yet.
        """
        try:
            mapped = self._mapped(name)
        except ModelNotFound:
            raise model_not_found(
                f"Model {name} not found! The following are available: {self.listed()}."
            ) from None
        if isinstance(mapped, str):
            raise model_not_found(f"Model {name} is not served over UM-Bridge: {mapped}.")
        return mapped

    def _mapped(self, name: str) -> Interface | str:
        metadata = self.client.metadata(name)
        cached = self._interfaces.get(name)
        if cached is not None and cached[0] is metadata:
            return cached[1]
        mapped: Interface | str
        try:
            mapped = interface_of(metadata)
        except Unmappable as ex:
            mapped = str(ex)
        with self._lock:
            self._interfaces[name] = (metadata, mapped)
        return mapped

    def resolve(self, request: Mapping[str, Any], feature: Feature | None = None) -> Interface:
        """Find the request's model, then check that it supports ``feature``.

        Raises:
            UmBridgeError: ModelNotFound or UnsupportedFeature.
        """
        name = read_name(request)
        if name is None:
            listed = self.listed()
            if not listed:
                raise model_not_found("the request names no model, and none is listed")
            name = listed[0]
        iface = self.interface(name)
        if feature is not None and not iface.supports(feature):
            raise unsupported_feature(f"{feature} not supported by model {iface.name}!")
        return iface

    # -- endpoints --------------------------------------------------------------

    def info(self) -> bytes:
        return encode_info(self.listed())

    def model_info(self, request: Mapping[str, Any]) -> bytes:
        return encode_model_info(self.resolve(request))

    def sizes(self, request: Mapping[str, Any], outputs: bool) -> bytes:
        iface = self.resolve(request)
        read_config(request)
        if outputs:
            return encode_sizes("outputSizes", iface.output_sizes)
        return encode_sizes("inputSizes", iface.input_sizes)

    def test_shmem(self, request: Mapping[str, Any]) -> bytes:
        self.resolve(request)
        value = shm.probe(request)
        return EMPTY_REPLY if value is None else orjson.dumps({"value": [value]})

    async def differentiate(
        self, feature: Feature, request: Mapping[str, Any], via_shm: bool
    ) -> bytes:
        """Run a derivative, with vectors in JSON or shared memory."""
        call = self._read_call(feature, request, via_shm)
        wrt = read_wrt(request, call.iface, feature)
        result = await self.derivative(call.iface, feature, call.vectors, wrt, call.config)
        return call.reply([result], lambda vectors: encode_vector(vectors[0]))

    async def evaluate(self, request: Mapping[str, Any], via_shm: bool) -> bytes:
        """Evaluate the model on one point, as one row of a batch."""
        call = self._read_call(Feature.EVALUATE, request, via_shm)
        iface = call.iface
        inputs = to_model_inputs(iface, call.vectors)
        result = await self.client.infer_async(iface.name, inputs, parameters=call.config)
        with result:
            arrays = {name: t.array() for name, t in result.outputs.items()}
            outputs = output_vectors(iface, arrays)
        return call.reply(outputs, encode_outputs)

    def _read_call(self, feature: Feature, request: Mapping[str, Any], via_shm: bool) -> _Call:
        iface = self.resolve(request, feature)
        config = read_config(request)
        channel = shm.Channel.from_request(request) if via_shm else None
        if channel is not None:
            vectors = channel.read_inputs(request, iface)
        else:
            vectors = read_inputs(request, iface)
        return _Call(iface, config, channel, vectors)

    # -- model calls ------------------------------------------------------------

    async def derivative(
        self,
        iface: Interface,
        feature: Feature,
        vectors: list[Vector],
        wrt: Wrt,
        config: dict[str, Any] | None,
    ) -> Vector:
        """Run a gradient, Jacobian action or Hessian action; check its length."""
        inputs = to_model_inputs(iface, vectors)
        in_wrt2 = None if wrt.in_wrt2 is None else iface.inputs[wrt.in_wrt2].name
        result = await self.client.derivative_async(
            iface.name,
            METHODS[feature],
            inputs,
            out_wrt=iface.outputs[wrt.out_wrt].name,
            in_wrt=iface.inputs[wrt.in_wrt].name,
            in_wrt2=in_wrt2,
            sens=wrt.sens,
            vec=wrt.vec,
            parameters=config,
        )
        # SPEC: PROTOCOL-FACTS §5.7 — the Hessian action has inputSizes[inWrt1]
        # entries, as PyPI 1.2.10 and the conformity suite expect.
        if feature is Feature.APPLY_JACOBIAN:
            expected = iface.output_sizes[wrt.out_wrt]
        else:
            expected = iface.input_sizes[wrt.in_wrt]
        return derivative_vector(result, expected, f"{feature} output of model {iface.name}")


def read_wrt(request: Mapping[str, Any], iface: Interface, feature: Feature) -> Wrt:
    """Read outWrt, inWrt (inWrt1, inWrt2), sens and vec for ``feature``.

    Raises:
        UmBridgeError: InvalidInput, an index out of range or a wrong length.
    """
    n_in, n_out = len(iface.input_sizes), len(iface.output_sizes)
    out_wrt = read_index(request, "outWrt", n_out, f"one of the {n_out} outputs")
    hessian = feature is Feature.APPLY_HESSIAN
    in_key = "inWrt1" if hessian else "inWrt"
    in_wrt = read_index(request, in_key, n_in, f"one of the {n_in} inputs")
    in_wrt2 = read_index(request, "inWrt2", n_in, f"one of the {n_in} inputs") if hessian else None
    sens = vec = None
    if feature in (Feature.GRADIENT, Feature.APPLY_HESSIAN):
        size = iface.output_sizes[out_wrt]
        sens = read_vector(request.get("sens"), f"Sensitivity vector sens (output {out_wrt})", size)
    if feature in (Feature.APPLY_JACOBIAN, Feature.APPLY_HESSIAN):
        target = in_wrt2 if in_wrt2 is not None else in_wrt
        size = iface.input_sizes[target]
        vec = read_vector(request.get("vec"), f"Vector vec (input {target})", size)
    return Wrt(out_wrt, in_wrt, in_wrt2, sens, vec)


__all__ = ["Bridge", "Wrt", "read_wrt"]
