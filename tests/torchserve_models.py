"""TorchServe model archives made at test time, without torch-model-archiver.

:func:`write_mar` writes ``NAME.mar``, a zip laid out as torch-model-archiver
0.12.0 lays one out: the model's files at the top (deflated), then
``MAR-INF/MANIFEST.json``, whose text is the archiver's to the byte
(``json.dumps(manifest, indent=2)``, no final newline, the keys in its
order, ``createdOn`` as ``%d/%m/%Y %H:%M:%S`` local time, ``runtime``
``python``, ``archiverVersion`` ``0.12.0``; the ``model`` keys only where
given: ``modelName``, ``serializedFile``, ``handler``, ``modelFile``,
``modelVersion``, ``requirementsFile``, ``configFile``).
:func:`write_model_dir` writes the same files unpacked in ``NAME/`` (the
archiver's ``--archive-format no-archive``), which TorchServe serves as it serves an archive.

The handlers are source strings, one per behaviour the tests look at; only
:data:`MNIST_HANDLER` (with :func:`mnist_state_dict`) needs torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

ARCHIVER_VERSION = "0.12.0"
MANIFEST = "MAR-INF/MANIFEST.json"
# A file's content: text, bytes, or a file to copy (its name in the archive is the key's).
Content = str | bytes | Path
# model_file / serialized_file: a file (kept under its own name) or (name, content).
NamedContent = Path | tuple[str, Content]

# (a) A module-level handler: TorchServe calls handle(None, context) once at load.
ECHO_HANDLER = '''
def _raw(context, i):
    try:  # under an envelope, rows are its elements, not requests
        headers = context.get_all_request_header(i)
    except (IndexError, KeyError, TypeError):
        return False
    return {k.lower(): v for k, v in headers.items()}.get("x-return") == "raw"


def handle(data, context):
    """Each request's body back: what arrived as "data" or "body" (JSON was decoded,
    text/* made str, the rest bytes), else its fields with bytes as text; with a
    header "X-Return: raw" the request's dict itself (which json.dumps refuses)."""
    if data is None:
        return None
    out = []
    for i, row in enumerate(data):
        value = row.get("data", row.get("body"))
        if _raw(context, i):
            value = row
        elif value is None:
            value = {k: v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray))
                     else v for k, v in row.items()}
        out.append(value)
    return out
'''

# What a handler sees of each request, as JSON: its fields with their Python types,
# the headers TorchServe passes (the HTTP ones and its own), the request id.
INSPECT_HANDLER = """
import json


def _show(value):
    if isinstance(value, (bytes, bytearray)):
        return {"type": type(value).__name__, "text": value.decode("utf-8", "replace")}
    return {"type": type(value).__name__, "value": value}


def handle(data, context):
    if data is None:
        return None
    out = []
    for i, row in enumerate(data):
        out.append(json.dumps({
            "fields": {k: _show(v) for k, v in row.items()},
            "headers": context.get_all_request_header(i),
            "request_id": context.get_request_id(i),
            "batch": len(data),
        }, sort_keys=True))
    return out
"""

# (b) A class-based handler (no BaseHandler, no torch; one class in the module, as
# TorchServe's loader requires) that reads an extra file and uses the context.
LABELS_HANDLER = """
import json
import os


class LabelHandler:
    def __init__(self):
        self.labels = None
        self.manifest = None

    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        with open(os.path.join(model_dir, "labels.json")) as f:
            self.labels = json.load(f)
        self.manifest = context.manifest
        print("LabelHandler initialized from", model_dir, flush=True)

    def handle(self, data, context):
        out = []
        for i, row in enumerate(data):
            value = row.get("data", row.get("body"))
            if isinstance(value, (bytes, bytearray)):
                value = value.decode("utf-8")
            key = str(value).strip()
            # Header names keep the client's case: look them up in any case.
            headers = {k.lower(): v for k, v in context.get_all_request_header(i).items()}
            wanted = headers.get("x-want-status")
            if wanted:
                context.set_response_status(int(wanted), "Custom Phrase", idx=i)
            context.set_response_header(i, "x-labels", str(len(self.labels)))
            out.append({
                "key": key,
                "label": self.labels.get(key),
                "model": self.manifest["model"]["modelName"],
                "version": self.manifest["model"]["modelVersion"],
                "get_request_header(i, 'x-tag')": context.get_request_header(i, "x-tag"),
                "get_request_header(i, 'X-Tag')": context.get_request_header(i, "X-Tag"),
                "batch_size": context.system_properties["batch_size"],
                "server": context.system_properties["server_name"],
                "server_version": context.system_properties["server_version"],
            })
        return out
"""
LABELS = {"0": "zero", "1": "one", "2": "two"}

# (c) One answer too many.
WRONG_LENGTH_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return ["extra"] * (len(data) + 1)
"""

# (d) Raises: a ValueError, or TorchServe's own PredictionException when asked.
RAISING_HANDLER = """
import logging

from ts.utils.util import PredictionException


def handle(data, context):
    if data is None:
        return None
    print("about to raise", flush=True)
    logging.getLogger(__name__).warning("logged with logging.warning")
    headers = {k.lower(): v for k, v in context.get_all_request_header(0).items()}
    if headers.get("x-raise") == "prediction":
        raise PredictionException("told to fail", 418)
    raise ValueError("the handler raised on purpose")
"""

# A handler that cannot load: its worker dies at every start.
BROKEN_HANDLER = """
raise RuntimeError("this handler cannot be imported")
"""

# (e) Streaming as pytorch/serve's test_send_intermediate_prediction_response.py,
# with a pause between the parts.
STREAM_HANDLER = """
import time

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if type(data) is list:
        for i in range(3):
            send_intermediate_predict_response(
                [f"part{i} "] * len(data),
                context.request_ids,
                "Intermediate Prediction success",
                200,
                context,
            )
            time.sleep(0.3)
        return ["last"] * len(data)
"""

# (f) Custom metrics as pytorch/serve's examples/custom_metrics (add_metric at
# initialisation, add_counter / add_time / add_size / add_percent per request).
METRICS_HANDLER = """
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes


def handle(data, context):
    metrics = context.metrics
    if data is None:
        metrics.add_metric(
            name="InitializeCallCount", value=1, unit="count",
            metric_type=MetricTypes.COUNTER,
        )
        return None
    metrics.add_counter(name="HandleCallCount", value=1, idx=None, dimensions=[])
    metrics.add_metric(
        name="RowsSeen", value=len(data), unit="count",
        dimensions=[Dimension(name="Kind", value="rows")],
        metric_type=MetricTypes.COUNTER,
    )
    metrics.add_time(name="HandlerTime", value=1.5, idx=None, unit="ms")
    metrics.add_size(name="BodySize", value=0.25, idx=None, unit="kB")
    metrics.add_percent(name="SomePercent", value=50, idx=None, dimensions=[],
                        metric_type=MetricTypes.HISTOGRAM)
    return ["counted"] * len(data)
"""

# (g) Batching: each request learns the size of the batch it came in.
BATCH_HANDLER = """
import time


def handle(data, context):
    if data is None:
        return None
    time.sleep(0.05)
    return [{"batch": len(data), "index": i,
             "batch_size": context.system_properties["batch_size"]}
            for i in range(len(data))]
"""
BATCH_CONFIG = "batchSize: 4\nmaxBatchDelay: 200\n"

# pytorch/serve's examples/image_classifier/mnist (v0.12.0): the network, and its
# handler with ImageClassifier's preprocessing written out (a PNG, or base64 text, in
# "data" or "body"; ToTensor and Normalize by hand; the argmax out): torchvision's
# wheel here does not load beside the CPU torch, and ImageClassifier imports it.
MNIST_MODEL = """
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output
"""
MNIST_HANDLER = """
import base64
import io

import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler


class MNISTDigitClassifier(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):
                image = base64.b64decode(image)
            if isinstance(image, (bytearray, bytes)):
                picture = Image.open(io.BytesIO(image)).convert("L")
                pixels = torch.frombuffer(bytearray(picture.tobytes()), dtype=torch.uint8)
                tensor = pixels.reshape(1, picture.height, picture.width).float() / 255.0
                image = (tensor - 0.1307) / 0.3081
            else:
                image = torch.FloatTensor(image)
            images.append(image)
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        return data.argmax(1).tolist()
"""


def manifest_text(
    name: str,
    handler: str,
    *,
    version: str | None = "1.0",
    serialized_file: str | None = None,
    model_file: str | None = None,
    requirements_file: str | None = None,
    config_file: str | None = None,
    created: datetime | None = None,
) -> str:
    """MAR-INF/MANIFEST.json as torch-model-archiver 0.12.0 writes it."""
    model: dict[str, Any] = {"modelName": name}
    if serialized_file:
        model["serializedFile"] = serialized_file
    model["handler"] = handler
    if model_file:
        model["modelFile"] = model_file
    if version:
        model["modelVersion"] = version
    if requirements_file:
        model["requirementsFile"] = requirements_file
    if config_file:
        model["configFile"] = config_file
    manifest = {
        "createdOn": (created or datetime.now()).strftime("%d/%m/%Y %H:%M:%S"),
        "runtime": "python",
        "model": model,
        "archiverVersion": ARCHIVER_VERSION,
    }
    return json.dumps(manifest, indent=2)


def _bytes(content: Content) -> bytes:
    if isinstance(content, Path):
        return content.read_bytes()
    return content.encode() if isinstance(content, str) else bytes(content)


def _named(item: NamedContent) -> tuple[str, bytes]:
    if isinstance(item, Path):
        return item.name, item.read_bytes()
    return item[0], _bytes(item[1])


def model_files(
    name: str,
    handler_source_or_path: str | Path,
    *,
    model_file: NamedContent | None = None,
    serialized_file: NamedContent | None = None,
    extra_files: Mapping[str, Content] | None = None,
    version: str = "1.0",
    config_yaml: str | None = None,
    requirements: str | None = None,
    handler_file: str = "handler.py",
    handler_entry: str | None = None,
) -> dict[str, bytes]:
    """Every file of the archive, MAR-INF/MANIFEST.json last, by its path inside it.

    ``handler_source_or_path`` is a ``.py`` file (kept under its own name) or
    source (written as ``handler_file``); ``handler_entry`` is the manifest's
    handler when not the file's name (``"handler.py:my_function"``).
    """
    files: dict[str, bytes] = {}
    if isinstance(handler_source_or_path, Path):
        handler_name = handler_source_or_path.name
        files[handler_name] = handler_source_or_path.read_bytes()
    else:
        handler_name = handler_file
        files[handler_name] = handler_source_or_path.encode()
    model_name = serial_name = None
    if model_file is not None:
        model_name, files_content = _named(model_file)
        files[model_name] = files_content
    if serialized_file is not None:
        serial_name, files_content = _named(serialized_file)
        files[serial_name] = files_content
    for path, content in (extra_files or {}).items():
        files[path] = _bytes(content)
    if requirements is not None:
        files["requirements.txt"] = requirements.encode()
    if config_yaml is not None:
        files["model-config.yaml"] = config_yaml.encode()
    files[MANIFEST] = manifest_text(
        name,
        handler_entry or handler_name,
        version=version,
        serialized_file=serial_name,
        model_file=model_name,
        requirements_file="requirements.txt" if requirements is not None else None,
        config_file="model-config.yaml" if config_yaml is not None else None,
    ).encode()
    return files


def write_mar(
    folder: Path,
    name: str,
    handler_source_or_path: str | Path,
    *,
    model_file: NamedContent | None = None,
    serialized_file: NamedContent | None = None,
    extra_files: Mapping[str, Content] | None = None,
    version: str = "1.0",
    config_yaml: str | None = None,
    requirements: str | None = None,
    handler_file: str = "handler.py",
    handler_entry: str | None = None,
    mar_name: str | None = None,
) -> Path:
    """Write ``folder/NAME.mar`` (or ``mar_name``) and return its path (see :func:`model_files`)."""
    files = model_files(
        name,
        handler_source_or_path,
        model_file=model_file,
        serialized_file=serialized_file,
        extra_files=extra_files,
        version=version,
        config_yaml=config_yaml,
        requirements=requirements,
        handler_file=handler_file,
        handler_entry=handler_entry,
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (mar_name or f"{name}.mar")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for inner, content in files.items():
            archive.writestr(inner, content)
    return path


def write_model_dir(
    folder: Path,
    name: str,
    handler_source_or_path: str | Path,
    *,
    model_file: NamedContent | None = None,
    serialized_file: NamedContent | None = None,
    extra_files: Mapping[str, Content] | None = None,
    version: str = "1.0",
    config_yaml: str | None = None,
    requirements: str | None = None,
    handler_file: str = "handler.py",
    handler_entry: str | None = None,
    dir_name: str | None = None,
) -> Path:
    """Write the unpacked archive ``folder/NAME/`` (or ``dir_name``) and return it."""
    files = model_files(
        name,
        handler_source_or_path,
        model_file=model_file,
        serialized_file=serialized_file,
        extra_files=extra_files,
        version=version,
        config_yaml=config_yaml,
        requirements=requirements,
        handler_file=handler_file,
        handler_entry=handler_entry,
    )
    root = folder / (dir_name or name)
    for inner, content in files.items():
        (root / inner).parent.mkdir(parents=True, exist_ok=True)
        (root / inner).write_bytes(content)
    return root


def mnist_state_dict(path: Path, seed: int = 0, python: str | None = None) -> Path:
    """Random weights for :data:`MNIST_MODEL`'s ``Net``, saved with torch: this Python's,
    or ``python``'s (a peer's environment) when given."""
    script = (
        f"{MNIST_MODEL}\n"
        "import sys\n"
        f"torch.manual_seed({seed})\n"
        "torch.save(Net().state_dict(), sys.argv[1])\n"
    )
    subprocess.run([python or sys.executable, "-c", script, str(path)], check=True)
    return path


def digit_png(size: int = 28) -> bytes:
    """A small grey-scale PNG (a bright square on black), written with the standard library."""
    import struct
    import zlib

    inside = range(size // 4, 3 * size // 4)
    rows = b"".join(
        b"\x00" + bytes(255 if x in inside and y in inside else 0 for x in range(size))
        for y in range(size)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
