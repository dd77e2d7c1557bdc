"""TorchServe archives of torch models: TorchScript with batching, and an eager MNIST network.

``write_script_mar`` writes ``scripted.mar``: a ``torch.jit.script``-ed
linear layer of fixed weights (``model.pt``, the manifest's serializedFile
and no modelFile, so BaseHandler loads it with ``torch.jit.load``), a handler
that subclasses BaseHandler (JSON rows in; each row's output and the size
of the batch it came in out), and ``batchSize: 4``, ``maxBatchDelay: 200``.
The model file is written by this Python's torch, or by ``python``'s.

``write_digits_mar`` writes ``digits.mar``: pytorch/serve's MNIST ``Net``
(examples/image_classifier/mnist, random weights) as an eager model
(modelFile and a state dict) under a BaseHandler subclass that decodes a
28x28 PNG with Pillow and torch: the example's own handler subclasses
ImageClassifier, which needs torchvision, whose CPU build this host's
registries lack.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.torchserve_models import MNIST_MODEL, mnist_state_dict, write_mar

HANDLER = """
import torch
from ts.torch_handler.base_handler import BaseHandler


class ScriptHandler(BaseHandler):
    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        return [{"y": row, "batch": len(data)} for row in data.tolist()]
"""
CONFIG = "batchSize: 4\nmaxBatchDelay: 200\nresponseTimeout: 60\n"
SCRIPT = """
import sys
import torch

layer = torch.nn.Linear(3, 2)
with torch.no_grad():
    layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.25]]))
    layer.bias.copy_(torch.tensor([0.5, -0.5]))
torch.jit.save(torch.jit.script(layer), sys.argv[1])
"""


def write_script_mar(folder: Path, work: Path, python: str | None = None) -> Path:
    """Write ``folder/scripted.mar``; ``work`` holds the model file while it is made."""
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model.pt"
    subprocess.run([python or sys.executable, "-c", SCRIPT, str(model)], check=True)
    return write_mar(folder, "scripted", HANDLER, serialized_file=model, config_yaml=CONFIG)


DIGITS_HANDLER = """
import io

import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler


class DigitHandler(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            raw = row.get("data") or row.get("body")
            image = Image.open(io.BytesIO(bytes(raw))).convert("L")
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
            pixels = pixels.reshape(1, image.height, image.width).float() / 255.0
            images.append((pixels - 0.1307) / 0.3081)
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        return data.argmax(1).tolist()
"""


def write_digits_mar(folder: Path, work: Path, python: str | None = None) -> Path:
    """Write ``folder/digits.mar``; ``work`` holds the weights while they are made."""
    work.mkdir(parents=True, exist_ok=True)
    weights = mnist_state_dict(work / "mnist_cnn.pt", python=python)
    return write_mar(
        folder,
        "digits",
        DIGITS_HANDLER,
        model_file=("mnist.py", MNIST_MODEL),
        serialized_file=weights,
    )
