"""Calls made the same way to real Triton and to the appliance, and their answers compared.

A :class:`Call` is one thing a tritonclient user does (an inference, a
metadata or repository request). :func:`answer` runs it over one transport
and turns what came back into plain data: ``("ok", value)`` with tensors as
lists and protobuf replies as JSON, or ``("error", status, message)``.
:func:`differences` says, call by call, where two servers' answers part:
a different kind or value, a different status, or an error message that
does not name what the call's ``words`` say it must (the tensor, the model,
the fault), which Triton's names as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.utils import InferenceServerException

Answer = tuple[Any, ...]


@dataclass(frozen=True)
class Call:
    name: str
    do: Callable[[ModuleType, Any], Any]
    # Words each server's error message must hold (compared without spaces).
    words: tuple[str, ...] = ()


def tensor(module: ModuleType, name: str, array: np.ndarray, dtype: str) -> Any:
    item = module.InferInput(name, list(array.shape), dtype)
    item.set_data_from_numpy(array)
    return item


def outputs(result: Any, *names: str) -> dict[str, Any]:
    """An inference result's named outputs as lists (BYTES as str)."""
    plain = {}
    for name in names:
        array = result.as_numpy(name)
        if array.dtype == object:
            array = np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b)(array)
        plain[name] = array.tolist()
    return plain


def answer(module: ModuleType, client: Any, call: Call) -> Answer:
    try:
        value = call.do(module, client)
    except InferenceServerException as ex:
        return ("error", str(ex.status()), str(ex.message()))
    if isinstance(value, Message):
        value = json_format.MessageToDict(value, preserving_proto_field_name=True)
    return ("ok", value)


def answers(module: ModuleType, url: str, calls: Iterable[Call]) -> dict[str, Answer]:
    client = module.InferenceServerClient(url)
    try:
        return {call.name: answer(module, client, call) for call in calls}
    finally:
        client.close()


def differences(
    triton: dict[str, Answer], appliance: dict[str, Answer], calls: Iterable[Call]
) -> list[str]:
    """Each call whose answers part, with both answers."""
    parted = []
    for call in calls:
        theirs, ours = triton[call.name], appliance[call.name]
        if theirs[:2] != ours[:2] or not _names_the_same(call, theirs, ours):
            parted.append(f"{call.name}:\n  triton:    {theirs}\n  appliance: {ours}")
    return parted


def _names_the_same(call: Call, theirs: Answer, ours: Answer) -> bool:
    if theirs[0] == "ok":
        return theirs == ours
    squeezed = [message.replace(" ", "") for message in (theirs[2], ours[2])]
    return all(word.replace(" ", "") in text for word in call.words for text in squeezed)


def transports(urls: dict[str, str]) -> list[tuple[ModuleType, str]]:
    import tritonclient.http as httpclient

    return [(httpclient, urls["http"]), (grpcclient, urls["grpc"])]
