"""Hostile JSON in every codec that reads JSON: depth, NaN, huge numbers, wrong types.

Every JSON reader in the appliance is orjson, which refuses nesting deeper
than 1024 with its own JSONDecodeError (no RecursionError), and refuses the
NaN/Infinity literals Python's json module writes. Data nested within that
limit is walked without recursion, or by numpy, which stops at 64 dims.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core import descriptor
from appliance.core.tensor import spec
from appliance.protocols.graphpipe.bind import decode_config
from appliance.protocols.graphpipe.errors import GraphPipeError
from appliance.protocols.grps import codec as grps_codec
from appliance.protocols.grps.errors import GrpsError
from appliance.protocols.kserve import codec as kserve_codec
from appliance.protocols.kserve.errors import DecodeError
from appliance.protocols.mip import items as mip_items
from appliance.protocols.mip.codec import Item, ItemType, MipError
from appliance.protocols.umbridge import codec as umbridge_codec
from appliance.protocols.umbridge.errors import UmBridgeError
from tools.fuzz import oracle, seeds
from tools.fuzz.targets import TARGETS

DEEP = 100_000
FP32 = spec("x", "FP32", [-1, -1])
STRINGS = spec("x", "BYTES", [-1, -1])


def mip_row(text: bytes, item_type: ItemType = ItemType.JSON, declared: Any = FP32) -> Any:
    return mip_items.decode_row(Item(item_type, memoryview(text)), declared, [-1], "item")


def descriptor_frame(body: bytes) -> bytes:
    header = descriptor.HEADER.pack(b"AP", 1, 2, 0, 0, 1, 1, 0.0, len(body))
    return header + body


# Each JSON entry point, and the error it may raise.
READERS: dict[str, tuple[Callable[[bytes], object], type[Exception]]] = {
    "kserve": (lambda b: kserve_codec.decode_infer_request(b, None, "m"), DecodeError),
    "grps": (grps_codec.decode_json_request, GrpsError),
    "umbridge": (umbridge_codec.decode_body, UmBridgeError),
    "mip JSON item": (mip_row, MipError),
    "mip TEXT item": (lambda b: mip_row(b, ItemType.TEXT), MipError),
    "mip BYTES item": (lambda b: mip_row(b, declared=STRINGS), MipError),
    "graphpipe config": (decode_config, GraphPipeError),
    "descriptor": (
        lambda b: descriptor.from_frame(descriptor_frame(b)),
        descriptor.DescriptorError,
    ),
}
DEEP_DOCUMENTS = {
    "arrays": b"[" * DEEP + b"]" * DEEP,
    "objects": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "unclosed": b"[" * DEEP,
    "mixed": b'[{"a":' * (DEEP // 2) + b"1" + b"}]" * (DEEP // 2),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("document", DEEP_DOCUMENTS)
def test_deeply_nested_json_is_refused_not_recursed(reader: str, document: str) -> None:
    decode, error = READERS[reader]
    if reader == "graphpipe config":
        # Config that is not a JSON object is passed on as text.
        assert decode(DEEP_DOCUMENTS[document]) == {"config": DEEP_DOCUMENTS[document].decode()}
        return
    with pytest.raises(error):
        decode(DEEP_DOCUMENTS[document])


@pytest.mark.parametrize("depth", [300, 1000])
def test_umbridge_names_a_deeply_nested_non_number_without_recursing(depth: int) -> None:
    request = umbridge_codec.decode_body(f'{{"input": [{nested(depth)}]}}'.encode())
    iface = umbridge_codec.interface_of(seeds.umbridge_models()[0])
    with pytest.raises(UmBridgeError, match="holds a non-number: an array"):
        umbridge_codec.read_inputs(request, iface)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize("depth", [63, 64, 65, 1000])
def test_tensor_data_nested_within_the_parsers_limit(depth: int) -> None:
    # Deep enough for orjson, too deep for a tensor: the codecs' own errors.
    data = nested(depth)
    tensor = {"name": "x", "shape": [1]}
    for datatype in ("FP32", "INT64", "BYTES"):
        doc = {"inputs": [{**tensor, "datatype": datatype, "data": "DATA"}]}
        body = json.dumps(doc).replace('"DATA"', data).encode()
        with contextlib.suppress(DecodeError):
            kserve_codec.decode_infer_request(body, None, "m")
    for text in (
        f'{{"ndarray": {data}}}',
        f'{{"gtensors": {{"tensors": [{{"flat_int32": {data}}}]}}}}',
    ):
        with contextlib.suppress(GrpsError):
            grps_codec.decode_json_request(text.encode())
    for declared in (FP32, STRINGS, spec("x", "INT64", [-1, -1])):
        with contextlib.suppress(MipError):
            mip_row(data.encode(), declared=declared)
    with contextlib.suppress(UmBridgeError):
        request = umbridge_codec.decode_body(f'{{"input": [{data}]}}'.encode())
        umbridge_codec.read_inputs(request, umbridge_codec.interface_of(seeds.umbridge_models()[0]))


KSERVE_FP32 = '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [L]}]}'
# NaN and Infinity are not JSON: what json.dumps writes for them is refused.
SPECIAL = ["NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "nan", "inf"]


@pytest.mark.parametrize("literal", SPECIAL)
def test_special_float_literals_are_refused_as_bad_json(literal: str) -> None:
    bodies = {
        "kserve": KSERVE_FP32.replace("L", literal),
        "grps": f'{{"ndarray": [{literal}]}}',
        "umbridge": f'{{"name": "forward", "input": [[{literal}]]}}',
        "mip JSON item": f"[{literal}]",
    }
    for reader, body in bodies.items():
        decode, error = READERS[reader]
        with pytest.raises(error):
            decode(body.encode())


@pytest.mark.parametrize(
    ("dtype", "value"), [("FP16", 65520), ("FP16", 1e300), ("FP32", 1e39), ("FP32", -(2**200))]
)
def test_kserve_refuses_finite_json_numbers_its_type_cannot_hold(dtype: str, value: float) -> None:
    tensor = {"name": "x", "datatype": dtype, "shape": [2], "data": [1, value]}
    with pytest.raises(DecodeError, match=f"too large for {dtype}"):
        kserve_codec.decode_infer_request(json.dumps({"inputs": [tensor]}).encode(), None, "m")


def test_kserve_keeps_the_largest_finite_values() -> None:
    tensor = {"name": "x", "datatype": "FP16", "shape": [2], "data": [65504, -65504.0]}
    request = kserve_codec.decode_infer_request(orjson.dumps({"inputs": [tensor]}), None, "m")
    assert request.inputs[0].data is not None
    assert request.inputs[0].data.array().tolist() == [65504, -65504]


# -- integers past 2**53 stay exact (numpy reads mixed lists as float64) ----------------


@pytest.mark.parametrize("text", ["\x80", "AP8=é", "ÿÿÿÿ"])
def test_grps_bin_data_beyond_ascii_is_not_base64(text: str) -> None:
    body = json.dumps({"bin_data": text}).encode()
    with pytest.raises(GrpsError, match="not valid base64"):
        grps_codec.decode_json_request(body)


def test_grps_int64_values_mixed_with_floats_stay_exact() -> None:
    doc = {"gtensors": {"tensors": [{"dtype": "DT_INT64", "flat_int64": [2**53 + 1, 1.0]}]}}
    ((_name, tensor),) = grps_codec.decode_json_request(orjson.dumps(doc)).tensors
    assert tensor.array().tolist() == [2**53 + 1, 1]
    doc["gtensors"]["tensors"][0]["flat_int64"] = ["9007199254740993", 2.0]
    ((_name, tensor),) = grps_codec.decode_json_request(orjson.dumps(doc)).tensors
    assert tensor.array().tolist() == [2**53 + 1, 2]


@pytest.mark.parametrize(
    ("dtype", "text", "values"),
    [
        ("UINT64", b"[9223372036854775809, 0]", [2**63 + 1, 0]),
        ("INT64", b"[9007199254740993, 1.0]", [2**53 + 1, 1]),
        ("UINT64", b"[18446744073709551615, 1.0]", [2**64 - 1, 1]),
    ],
)
def test_mip_json_integers_stay_exact(dtype: str, text: bytes, values: list[int]) -> None:
    assert mip_row(text, declared=spec("x", dtype, [-1, -1])).tolist() == values


@pytest.mark.parametrize(
    ("dtype", "text"),
    [("UINT64", b"[18446744073709551616, 1.0]"), ("INT8", b"[1.5, 2]"), ("INT32", b"[1e300, 1]")],
)
def test_mip_json_integers_that_do_not_fit_are_shape_errors(dtype: str, text: bytes) -> None:
    with pytest.raises(MipError):
        mip_row(text, declared=spec("x", dtype, [-1, -1]))


# -- any value at any place of a real request -----------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | st.sampled_from([2**63, 2**64, -(2**63) - 1, 1e308, 5e-324, -0.0]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def places(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc``."""
    found = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += places(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += places(value, (*path, index))
    return found


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


JSON_TARGETS = {
    "kserve_rest": lambda body: b"\x00" + body,
    "grps_json": lambda body: body,
    "umbridge": lambda body: body,
}


@pytest.mark.parametrize("name", JSON_TARGETS)
def test_any_value_anywhere_in_a_real_request(name: str) -> None:
    frame = JSON_TARGETS[name]
    documents = [
        orjson.loads(seed[1:] if name == "kserve_rest" else seed) for seed in _json_seeds(name)
    ]

    @settings(
        max_examples=oracle.examples(150),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.sampled_from(documents), st.data(), json_values)
    def run(doc: Any, data: st.DataObject, value: Any) -> None:
        path = data.draw(st.sampled_from(places(doc)))
        body = json.dumps(replaced(doc, path, value), allow_nan=False).encode()
        TARGETS[name].run(frame(body))

    run()


def _json_seeds(name: str) -> list[bytes]:
    if name == "kserve_rest":
        return [seed for seed in TARGETS[name].seeds() if seed[0] == 0]
    return list(TARGETS[name].seeds())
