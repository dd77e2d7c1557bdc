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

import threading
from collections.abc import Callable, Collection, Iterable
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


def at_once(one: Callable[[int], None], count: int, timeout_s: float = 30.0) -> None:
    """Run ``one(0)`` to ``one(count - 1)`` in threads started together; wait for each."""
    threads = [threading.Thread(target=one, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)


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
        found = {}
        for call in calls:
            try:
                found[call.name] = answer(module, client, call)
            except Exception as ex:
                # A call that fails other than with the server's answer (a timeout, a
                # reset): say which server and which call, so a flake is told from a bug.
                ex.add_note(f"while calling {url}: {call.name}")
                raise
        return found
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


def urls_of(appliance: Any) -> dict[str, str]:
    """A test appliance's (tests/system/harness.py) HTTP and gRPC addresses."""
    return {kind: f"127.0.0.1:{appliance.ports[kind]}" for kind in ("http", "grpc")}


def both(
    triton_urls: dict[str, str], appliance_urls: dict[str, str], transport: str, calls: list[Call]
) -> tuple[dict[str, Answer], dict[str, Answer]]:
    """Triton's answers and the appliance's to ``calls`` over ``transport`` (http or grpc)."""
    index = 0 if transport == "http" else 1
    module, triton_url = transports(triton_urls)[index]
    _, appliance_url = transports(appliance_urls)[index]
    return answers(module, triton_url, calls), answers(module, appliance_url, calls)


def assert_on_purpose(
    theirs: dict[str, Answer],
    ours: dict[str, Answer],
    calls: list[Call],
    on_purpose: dict[str, tuple[str, str, str]],
    transport: str,
    triton_answers: Collection[str] = (),
) -> None:
    """Each call the appliance answers otherwise on purpose: Triton still answers as it
    did (an error, or an answer for those in ``triton_answers``), and the appliance with
    its own status (REST, gRPC) and a message that names the call's words."""
    for call in calls:
        rest, grpc, why = on_purpose[call.name]
        kind = "ok" if call.name in triton_answers else "error"
        assert theirs[call.name][0] == kind, f"{call.name}: Triton now answers {theirs}"
        assert ours[call.name][:2] == ("error", rest if transport == "http" else grpc), why
        assert all(word in ours[call.name][2] for word in call.words), ours
