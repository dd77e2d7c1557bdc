"""Models that exist only for tests: they make batching, slowness and failure visible."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from appliance.demos.sequence import SimpleSequence
from appliance.model import Arrays, Model, Outputs, OutputsWithParameters, spec


class BatchProbe(Model):
    """y = 2x, and ``batch`` tells each row how many rows its batch had.

    With the ``gate`` option (a directory), a request with the ``hold``
    parameter leaves ``running`` there and waits while ``hold`` exists: a
    test decides what queues behind a running batch.
    """

    inputs = [spec("x", "FP32", [-1, 4])]
    outputs = [spec("y", "FP32", [-1, 4]), spec("batch", "INT32", [-1, 1])]
    max_batch_size = 16

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        x = inputs["x"]
        time.sleep(float(self.options.get("delay_s", 0.0)))
        if parameters.get("hold") and "gate" in self.options:
            self._wait_at_gate(Path(self.options["gate"]))
        batch = np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)
        return {"y": 2 * x, "batch": batch}

    @staticmethod
    def _wait_at_gate(gate: Path) -> None:
        (gate / "running").touch()
        deadline = time.monotonic() + 30.0
        while (gate / "hold").exists() and time.monotonic() < deadline:
            time.sleep(0.01)


class GatedSequence(SimpleSequence):
    """``simple_sequence`` whose steps after the first wait at a gate (see BatchProbe).

    A test kills the instance while a step waits there: a step in flight.
    """

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        if not inputs["START"].any():
            BatchProbe._wait_at_gate(Path(self.options["gate"]))
        return super().predict(inputs, parameters)


class Slow(Model):
    """Return the input after sleeping ``sleep_s`` (a request parameter).

    ``hog_mib`` (a request parameter) makes the instance take and keep that
    much more memory first, as a leak would.
    """

    inputs = [spec("x", "FP32", [-1])]
    outputs = [spec("y", "FP32", [-1])]
    hogged: list[np.ndarray[Any, Any]] = []

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        if parameters.get("hog_mib"):
            self.hogged.append(np.ones(int(parameters["hog_mib"]) << 20, dtype=np.uint8))
        time.sleep(float(parameters.get("sleep_s", self.options.get("sleep_s", 0.0))))
        if parameters.get("fail"):
            raise ValueError("asked to fail")
        if parameters.get("abort"):
            os.abort()
        return {"y": inputs["x"]}


class BrokenLoad(Model):
    """A model whose load() always fails."""

    inputs = [spec("x", "FP32", [-1])]
    outputs = [spec("y", "FP32", [-1])]

    def load(self) -> None:
        raise FileNotFoundError("weights.bin is missing")


class Tagged(Model):
    """Return ``x`` and the ``tag`` option, so a reload's effect is visible."""

    inputs = [spec("x", "FP32", [-1])]
    outputs = [spec("y", "FP32", [-1]), spec("tag", "BYTES", [1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        time.sleep(float(self.options.get("delay_s", 0.0)))
        tag = np.array([str(self.options.get("tag", ""))], dtype=object)
        return {"y": inputs["x"], "tag": tag}


class Described(Model):
    """Return ``x`` doubled, with parameters of the output and of the response (a
    batched model: every request of a batch gets them); a list value has no place in
    gRPC's map."""

    inputs = [spec("x", "FP32", [-1, 2])]
    outputs = [spec("y", "FP32", [-1, 2]), spec("n", "INT32", [-1, 1])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        x = inputs["x"]
        y = {"content_type": "np", "scale": 2, "exact": True, "ratio": 0.5, "axes": [0, 1]}
        rows = np.full((len(x), 1), len(x), np.int32)
        said = {"content_type": "pd", "rows": len(x), "tags": ["a"]}
        return OutputsWithParameters({"y": x * 2, "n": rows}, {"y": y, "nope": {"a": 1}}, said)


class DescribedEcho(Model):
    """Return ``x`` itself (a view of the request's own memory, handed back without a
    copy) with parameters of the output and of the response."""

    inputs = [spec("x", "FP32", [-1, 2])]
    outputs = [spec("y", "FP32", [-1, 2]), spec("n", "INT32", [1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        x = inputs["x"]
        rows = np.array([len(x)], np.int32)
        given = {"y": {"content_type": "np"}, "n": {"rows": True}}
        return OutputsWithParameters({"y": x, "n": rows}, given, {"echoed": True})


class ParameterEcho(Model):
    """Return the request parameters the model was given, as JSON."""

    inputs = [spec("x", "FP32", [-1])]
    outputs = [spec("parameters", "BYTES", [1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"parameters": np.array([json.dumps(dict(parameters)).encode()], dtype=object)}


class Invert(Model):
    """RGB images in; inverted images and each image's mean out."""

    inputs = [spec("image", "UINT8", [-1, -1, -1, 3])]
    outputs = [spec("inverted", "UINT8", [-1, -1, -1, 3]), spec("mean", "FP64", [-1, 1])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        image = inputs["image"]
        mean = image.reshape(image.shape[0], -1).mean(axis=1, keepdims=True)
        return {"inverted": 255 - image, "mean": mean}


class Failing(Model):
    """A generic model whose predict always raises."""

    inputs = None
    outputs = None

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        raise RuntimeError("this model always fails")


class Scaled(Model):
    """y = ``factor`` * x after ``delay_s``: fixed-size numbers, so every protocol can call it.

    A reload that changes ``factor`` shows in every protocol's replies.
    """

    inputs = [spec("x", "FP32", [-1, 4])]
    outputs = [spec("y", "FP32", [-1, 4])]
    max_batch_size = 16

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        time.sleep(float(self.options.get("delay_s", 0.0)))
        return {"y": np.float32(self.options.get("factor", 2.0)) * inputs["x"]}


class Rendezvous(Model):
    """y = x; a gradient or a stream answers only once ``parties`` calls run at once.

    Each call leaves a file in ``options["dir"]`` (below the request's
    ``round`` parameter, if given) and waits for the others' there, across
    instances. So the calls succeed only if the frontend sends them all to
    the models at the same time; otherwise they fail after ``wait_s``.
    """

    inputs = [spec("x", "FP64", [1])]
    outputs = [spec("y", "FP64", [1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"y": inputs["x"]}

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        self._meet(parameters)
        yield {"y": inputs["x"]}

    def gradient(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, sens: Any, parameters: Any
    ) -> Any:
        self._meet(parameters)
        return np.ravel(sens)

    def _meet(self, parameters: Mapping[str, Any]) -> None:
        where = Path(self.options["dir"]) / str(parameters.get("round", ""))
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        deadline = time.monotonic() + float(self.options.get("wait_s", 20.0))
        while len(list(where.iterdir())) < int(self.options["parties"]):
            if time.monotonic() > deadline:
                raise TimeoutError("the other calls never reached a model")
            time.sleep(0.01)


class Flood(Model):
    """A stream of ``count`` parts of ``size`` bytes (options), as fast as they are asked for.

    Before each part it writes how many it has made to ``made`` in
    ``options["dir"]``: so a test sees whether the stream was held back.
    """

    inputs = [spec("count", "INT32", [1])]
    outputs = [spec("data", "UINT8", [-1]), spec("index", "INT32", [1])]

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        made = Path(self.options["dir"]) / "made"
        writing = made.with_suffix(".new")
        size = int(self.options.get("size", 4096))
        for index in range(int(inputs["count"][0])):
            # Renamed into place: a reader never sees it half written.
            writing.write_text(str(index + 1))
            writing.replace(made)
            yield {"data": np.full(size, 7, np.uint8), "index": np.array([index], np.int32)}


# Stand-ins for the three models of the ensemble in Triton's architecture guide
# (docs/user_guide/architecture.md): an image's bytes -> a 3x224x224 tensor, read
# by a classifier and a segmenter. Each result is a function of the image's length.
IMAGE = [-1, 3, 224, 224]


class ImagePreprocess(Model):
    """RAW_IMAGE (bytes) -> PREPROCESSED_OUTPUT, every element the image's length."""

    inputs = [spec("RAW_IMAGE", "BYTES", [-1, 1])]
    outputs = [spec("PREPROCESSED_OUTPUT", "FP32", IMAGE)]
    max_batch_size = 1

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        sizes = [len(row[0]) for row in inputs["RAW_IMAGE"]]
        return {"PREPROCESSED_OUTPUT": np.stack([np.full(IMAGE[1:], n, np.float32) for n in sizes])}


class Classification(Model):
    """FORMATTED_IMAGE -> CLASSIFICATION_OUTPUT: 1000 scores, each the image's mean."""

    inputs = [spec("FORMATTED_IMAGE", "FP32", IMAGE)]
    outputs = [spec("CLASSIFICATION_OUTPUT", "FP32", [-1, 1000])]
    max_batch_size = 1

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        image = inputs["FORMATTED_IMAGE"]
        means = image.reshape(image.shape[0], -1).mean(axis=1, keepdims=True)
        return {"CLASSIFICATION_OUTPUT": np.repeat(means, 1000, axis=1)}


class Segmentation(Model):
    """FORMATTED_IMAGE -> SEGMENTATION_OUTPUT: the image, doubled."""

    inputs = [spec("FORMATTED_IMAGE", "FP32", IMAGE)]
    outputs = [spec("SEGMENTATION_OUTPUT", "FP32", IMAGE)]
    max_batch_size = 1

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"SEGMENTATION_OUTPUT": 2 * inputs["FORMATTED_IMAGE"]}
