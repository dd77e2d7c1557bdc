"""MIP over real sockets: KubeMo's own client, and ours for TENSOR items.

One appliance serves a MIP listener per model (test models in tests/models.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from kubemo.client import Client
from kubemo.errors import InvocationError
from kubemo.serialize import Image, Json, Text
from PIL import Image as PilImage

from appliance.core.status import Counter
from appliance.protocols.mip.client import (
    MipClient,
    MipReplyError,
    decode_item,
    json_item,
    tensor_item,
    text_item,
)
from appliance.protocols.mip.codec import ItemType
from tests.system.harness import Appliance, counted, demo_models, running

SERVED = ["echo", "simple", "simple_string", "identity", "digits", "forward", "probe", "invert"]


@pytest.fixture(scope="module")
def mip() -> Iterator[Appliance]:
    models = demo_models("echo", "simple", "simple_string", "identity", "digits", "forward")
    models += [
        {"name": "probe", "class": "tests.models:BatchProbe"},
        {"name": "invert", "class": "tests.models:Invert"},
    ]
    listeners = [{"port": 0, "model": name} for name in SERVED]
    listeners[0] = {"port": 0}  # no model: server.default_model
    with running(models, server={"default_model": "echo"}, mip={"listeners": listeners}) as app:
        yield app


def port(app: Appliance, model: str) -> int:
    return next(int(x["port"]) for x in app.state["mip_listeners"] if x["model"] == model)


def url(app: Appliance, model: str) -> str:
    return f"tcp://127.0.0.1:{port(app, model)}"


def raw_json(value: Any) -> Json:
    # PROTOCOL-FACTS §4.3: Json(obj) breaks the stock client; bytes work.
    return Json(io.BytesIO(json.dumps(value).encode()))


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    PilImage.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


# -- KubeMo's client -------------------------------------------------------------------


def test_listeners_map_ports_to_models(mip: Appliance) -> None:
    listeners = mip.state["mip_listeners"]
    assert [x["model"] for x in listeners] == SERVED
    assert mip.ports["mip"] == listeners[0]["port"]
    assert len({x["port"] for x in listeners}) == len(SERVED)


def test_kubemo_pings(mip: Appliance) -> None:
    assert Client().ping(url(mip, "echo")) > 0


@pytest.mark.parametrize("size", [1, 8, 64])
def test_kubemo_text_and_json_items_echo(mip: Appliance, size: int) -> None:
    batch = tuple((Text(f"text {i}"), raw_json({"i": i, "list": [i, 1.5]})) for i in range(size))
    outputs = Client().inference(url(mip, "echo"), batch)
    assert len(outputs) == size
    for i, (text, value) in enumerate(outputs):
        assert text.decode() == f"text {i}"
        assert value.decode() == {"i": i, "list": [i, 1.5]}


@pytest.mark.parametrize("size", [1, 8, 64])
def test_kubemo_json_batches_run_digits(mip: Appliance, size: int) -> None:
    rng = np.random.default_rng(size)
    pixels = rng.integers(0, 17, size=(size, 64)).astype(np.float32)
    before = mip.client().counters("digits")
    outputs = Client().inference(url(mip, "digits"), tuple((raw_json(p.tolist()),) for p in pixels))
    with mip.client().infer("digits", {"pixels": pixels}) as result:
        expected = result.array("probabilities").copy()
    got = np.array([row[0].decode() for row in outputs], dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    after = counted(mip.client(), "digits", 2, before)
    # The MIP batch rode the core as one request (plus the direct call above).
    assert after[Counter.BATCH_ROWS] - before[Counter.BATCH_ROWS] == 2 * size
    assert after[Counter.SUCCESS] - before[Counter.SUCCESS] == 2


def test_kubemo_reads_the_true_output_count(mip: Appliance) -> None:
    # One input, two outputs: the reference server would announce 1 output.
    outputs = Client().inference(url(mip, "probe"), ((raw_json([1, 2, 3, 4]),),))
    [[y, batch]] = outputs
    assert y.decode() == [2.0, 4.0, 6.0, 8.0]
    assert batch.decode() == [1]


def test_kubemo_text_items_for_strings(mip: Appliance) -> None:
    outputs = Client().inference(
        url(mip, "simple_string"),
        ((raw_json([str(i) for i in range(16)]), raw_json(["1"] * 16)),),
    )
    [[total, difference]] = outputs
    assert total.decode() == [str(i + 1) for i in range(16)]
    assert difference.decode() == [str(i - 1) for i in range(16)]


def test_kubemo_image_items(mip: Appliance) -> None:
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    data = png(pixels)
    [[inverted, mean]] = Client().inference(url(mip, "invert"), ((Image(io.BytesIO(data)),),))
    assert np.array_equal(np.asarray(inverted.decode()), 255 - pixels)
    assert mean.decode() == [pytest.approx(pixels.mean())]
    # A generic model gets the file's bytes as they are.
    [[echoed]] = Client().inference(url(mip, "echo"), ((Image(io.BytesIO(data)),),))
    assert np.array_equal(np.asarray(echoed.decode()), pixels)


def test_kubemo_sees_errors_as_invocation_errors(mip: Appliance) -> None:
    with pytest.raises(InvocationError, match="error code: 4"):
        Client().inference(url(mip, "simple"), ((Text("not two inputs"),),))


# -- our client: TENSOR items ------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 8, 64])
def test_tensor_items_against_identity(mip: Appliance, size: int) -> None:
    rows = np.random.default_rng(0).standard_normal((size, 1000)).astype(np.float32)
    with MipClient("127.0.0.1", port(mip, "identity")) as client:
        outputs = client.infer([[tensor_item(row)] for row in rows])
    assert [item[0] for element in outputs for item in element] == [ItemType.TENSOR] * size
    np.testing.assert_array_equal(np.stack([decode_item(e[0]) for e in outputs]), rows)


def test_tensor_items_against_simple(mip: Appliance) -> None:
    a = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    b = np.ones((8, 16), dtype=np.int32)
    with MipClient("127.0.0.1", port(mip, "simple")) as client:
        outputs = client.infer(
            [[tensor_item(x), tensor_item(y)] for x, y in zip(a, b, strict=True)]
        )
    np.testing.assert_array_equal(np.stack([decode_item(e[0]) for e in outputs]), a + b)
    np.testing.assert_array_equal(np.stack([decode_item(e[1]) for e in outputs]), a - b)


def test_tensor_items_against_digits_batch_64(mip: Appliance) -> None:
    pixels = np.random.default_rng(1).integers(0, 17, size=(64, 64)).astype(np.float32)
    with MipClient("127.0.0.1", port(mip, "digits")) as client:
        outputs = client.infer([[tensor_item(p)] for p in pixels])
    with mip.client().infer("digits", {"pixels": pixels}) as result:
        expected = result.array("probabilities").copy()
    np.testing.assert_array_equal(np.stack([decode_item(e[0]) for e in outputs]), expected)


def test_a_batch_over_max_batch_size_is_split_and_reassembled(mip: Appliance) -> None:
    # probe's max_batch_size is 16: 40 rows go as 16 + 16 + 8, in order.
    x = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    with MipClient("127.0.0.1", port(mip, "probe")) as client:
        outputs = client.infer([[tensor_item(row)] for row in x])
    np.testing.assert_array_equal(np.stack([decode_item(e[0]) for e in outputs]), 2 * x)
    sizes = [int(decode_item(e[1])[0]) for e in outputs]
    assert sizes == [16] * 32 + [8] * 8


def test_replies_use_the_item_type_of_each_request_position(mip: Appliance) -> None:
    with MipClient("127.0.0.1", port(mip, "forward")) as client:
        outputs = client.infer(
            [[tensor_item(np.array([1.5]))], [json_item([2.0])], [text_item("3")]]
        )
    assert [e[0][0] for e in outputs] == [ItemType.TENSOR, ItemType.JSON, ItemType.TEXT]
    assert decode_item(outputs[0][0]).tolist() == [3.0]
    assert decode_item(outputs[1][0]) == [4.0]
    assert decode_item(outputs[2][0]) == "[6.0]"


def test_generic_models_take_any_items_ragged_batches_included(mip: Appliance) -> None:
    with MipClient("127.0.0.1", port(mip, "echo")) as client:
        batch = [
            [tensor_item(np.arange(3, dtype=np.int64)), text_item("a")],
            [tensor_item(np.arange(5, dtype=np.int64)), json_item({"b": 1})],
        ]
        outputs = client.infer(batch)
    assert decode_item(outputs[0][0]).tolist() == [0, 1, 2]
    assert decode_item(outputs[1][0]).tolist() == [0, 1, 2, 3, 4]
    assert decode_item(outputs[0][1]) == "a"
    assert decode_item(outputs[1][1]) == {"b": 1}


def test_bytes_tensor_items(mip: Appliance) -> None:
    strings = np.array([b"a\0b", b"", "é".encode()], dtype=object)
    with MipClient("127.0.0.1", port(mip, "echo")) as client:
        [[out]] = client.infer([[tensor_item(strings)]])
    assert decode_item(out).tolist() == strings.tolist()


def test_json_numbers_must_convert_exactly(mip: Appliance) -> None:
    with MipClient("127.0.0.1", port(mip, "simple")) as client:
        for bad, words in [
            ([1.5] * 16, "non-integers"),
            ([2**40] * 16, "outside"),
            ([1] * 15, r"shape \[15\]"),
            (["1"] * 16, "must hold numbers"),
        ]:
            with pytest.raises(MipReplyError, match=words) as caught:
                client.infer([[json_item(bad), json_item([0] * 16)]])
            assert caught.value.code == 4
        [[total, _difference]] = client.infer([[json_item([2.0] * 16), json_item([1] * 16)]])
    assert decode_item(total) == [3] * 16


def test_tensor_dtype_must_match_the_input(mip: Appliance) -> None:
    with (
        MipClient("127.0.0.1", port(mip, "identity")) as client,
        pytest.raises(MipReplyError, match="dtype FP64, the input is FP32") as caught,
    ):
        client.infer([[tensor_item(np.zeros(4))]])
    assert caught.value.code == 4


def test_images_need_an_image_like_input(mip: Appliance) -> None:
    with MipClient("127.0.0.1", port(mip, "digits")) as client:
        with pytest.raises(MipReplyError, match="image-like") as caught:
            client.infer([[(ItemType.IMAGE, png(np.zeros((8, 8), np.uint8)))]])
        assert caught.value.code == 4
    with MipClient("127.0.0.1", port(mip, "invert")) as client:
        with pytest.raises(MipReplyError, match="not an image") as caught:
            client.infer([[(ItemType.IMAGE, b"not a png")]])
        assert caught.value.code == 4


def test_a_batch_of_images(mip: Appliance) -> None:
    images = [np.full((3, 5, 3), value, dtype=np.uint8) for value in (0, 100, 255)]
    with MipClient("127.0.0.1", port(mip, "invert")) as client:
        outputs = client.infer([[(ItemType.IMAGE, png(image))] for image in images])
    for image, (inverted, mean) in zip(images, outputs, strict=True):
        assert inverted[0] is ItemType.IMAGE
        decoded = np.asarray(PilImage.open(io.BytesIO(inverted[1])))
        assert np.array_equal(decoded, 255 - image)
        assert mean[0] is ItemType.JSON
        assert decode_item(mean) == [float(image.mean())]
