"""The ONNX Runtime and TorchScript runtimes, loaded in process (no server).

ONNX test models are written here as protobuf bytes (an Identity per
tensor), so the tests need onnxruntime but not the onnx package. TorchScript
test modules are scripted from the classes below.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from appliance.core.dtypes import DType
from appliance.core.tensor import TensorSpec
from appliance.demos.digits import Digits
from appliance.formats.repository import scan
from appliance.runtimes.broken import Broken
from appliance.runtimes.interface import DEFAULT_MAX_BATCH_SIZE, ModelFileError
from appliance.runtimes.onnx import OnnxModel
from appliance.runtimes.torchscript import TorchScriptModel, writes_in_place
from tests.onnx_graph import Graph

ROOT = Path(__file__).resolve().parents[2]
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
EXAMPLES = ROOT / "appliance" / "demos" / "repository"


def identity_model(tensors: list[tuple[str, str, str, list[int | str]]]) -> bytes:
    """Return an ONNX model computing output = Identity(input) per (in, out, dtype, shape)."""
    graph = Graph("identity")
    for src, dst, dtype, shape in tensors:
        graph.input(src, dtype, shape)
        graph.output(dst, dtype, shape)
        graph.node("Identity", [src], [dst])
    return graph.encode()


def onnx_file(tmp_path: Path, model: bytes, name: str = "m") -> Path:
    path = tmp_path / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(model)
    return path


def loaded_onnx(path: Path, **options: Any) -> OnnxModel:
    model = OnnxModel({"path": str(path), "version": "1", **options})
    model.load()
    return model


def frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only array, as request tensors arrive from shared memory."""
    array.flags.writeable = False
    return array


# -- ONNX ----------------------------------------------------------------------------


def test_onnx_interface_comes_from_the_file(tmp_path: Path) -> None:
    path = onnx_file(
        tmp_path,
        identity_model([("a", "b", "FP32", ["batch", 3]), ("s", "t", "BYTES", ["batch"])]),
    )
    model = loaded_onnx(path)
    assert model.inputs == [
        TensorSpec("a", DType.FP32, (-1, 3)),
        TensorSpec("s", DType.BYTES, (-1,)),
    ]
    assert [spec.name for spec in model.outputs or ()] == ["b", "t"]
    assert model.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert (model.platform, model.version) == ("onnxruntime_onnx", "1")
    a = frozen(np.arange(6, dtype=np.float32).reshape(2, 3))
    s = frozen(np.array([b"caf\xc3\xa9", b""], dtype=object))
    out = model.predict({"a": a, "s": s}, {})
    assert np.array_equal(np.asarray(out["b"]), a)
    assert list(np.asarray(out["t"])) == ["café", ""]
    with pytest.raises(ValueError, match="input s: an element is not UTF-8"):
        model.predict({"a": a, "s": np.array([b"\xff", b""], dtype=object)}, {})


def test_onnx_without_a_free_first_dim_everywhere_is_not_batched(tmp_path: Path) -> None:
    path = onnx_file(
        tmp_path, identity_model([("a", "b", "FP32", ["n", 3]), ("c", "d", "INT64", [2])])
    )
    model = loaded_onnx(path)
    assert model.max_batch_size == 0
    assert model.inputs is not None
    assert model.inputs[1].shape == (2,)


def test_onnx_sessions_suit_one_process_per_instance(tmp_path: Path) -> None:
    model = loaded_onnx(onnx_file(tmp_path, identity_model([("a", "b", "FP32", [1])])), threads=2)
    options = model._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_onnx_config_may_fix_free_dims(tmp_path: Path) -> None:
    path = onnx_file(tmp_path, identity_model([("a", "b", "FP32", ["batch", "n"])]))
    model = loaded_onnx(path, inputs=[{"name": "a", "dtype": "TYPE_FP32", "shape": [-1, 4]}])
    assert model.inputs == [TensorSpec("a", DType.FP32, (-1, 4))]
    assert model.outputs == [TensorSpec("b", DType.FP32, (-1, -1))]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"name": "x"}, "inputs\\[0\\] names 'x', but the model's inputs are a"),
        ({"name": "a", "dtype": "FP64"}, "inputs a is FP32 in the model file, not FP64"),
        ({"name": "a", "dtype": "REAL"}, "unsupported datatype 'REAL'"),
        ({"name": "a", "shape": [-1, 3]}, "may only fix its free \\(-1\\) dimensions"),
        ({"name": "a", "shape": [2]}, "may only fix its free"),
    ],
)
def test_onnx_config_must_agree_with_the_file(
    tmp_path: Path, table: dict[str, Any], message: str
) -> None:
    path = onnx_file(tmp_path, identity_model([("a", "b", "FP32", [-1, 2])]))
    with pytest.raises(ModelFileError, match=message):
        loaded_onnx(path, inputs=[table])


def test_onnx_refuses_types_it_cannot_carry_and_broken_files(tmp_path: Path) -> None:
    path = onnx_file(tmp_path, identity_model([("a", "b", "BF16", [1])]))
    with pytest.raises(
        ModelFileError, match=r"m/1/model.onnx: input a has type tensor\(bfloat16\)"
    ):
        loaded_onnx(path)
    path.write_bytes(b"not a protobuf at all")
    with pytest.raises(ModelFileError, match=r"ONNX Runtime cannot load m/1/model\.onnx: INVALID"):
        loaded_onnx(path)


# -- TorchScript ----------------------------------------------------------------------


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, (y + 1).sum(dim=1)


class InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x.mul_(3)
        return {"z": x}


def torch_file(tmp_path: Path, module: torch.nn.Module, name: str = "t") -> Path:
    path = tmp_path / name / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        scripted: Any = torch.jit.script(module)
    scripted.save(str(path))
    return path


def tables(*specs: tuple[str, str, list[int]]) -> list[dict[str, Any]]:
    return [{"name": name, "dtype": dtype, "shape": shape} for name, dtype, shape in specs]


DOUBLER_IO = {
    "inputs": tables(("x", "FP32", [-1, 3]), ("y", "INT64", [-1, 2])),
    "outputs": tables(("twice", "FP32", [-1, 3]), ("total", "INT64", [-1])),
}


def loaded_torch(path: Path, **options: Any) -> TorchScriptModel:
    model = TorchScriptModel({"path": str(path), "version": "4", **options})
    model.load()
    return model


def test_torchscript_serves_declared_tensors_without_copying(tmp_path: Path) -> None:
    model = loaded_torch(torch_file(tmp_path, Doubler()), **DOUBLER_IO)
    assert model.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert (model.platform, model.version) == ("pytorch_libtorch", "4")
    assert model.zero_copy
    x = frozen(np.ones((2, 3), np.float32))
    y = frozen(np.arange(4, dtype=np.int64).reshape(2, 2))
    out = model.predict({"x": x, "y": y}, {})
    assert np.array_equal(np.asarray(out["twice"]), 2 * x)
    assert np.asarray(out["total"]).tolist() == [3, 7]


def test_torchscript_copies_inputs_for_a_graph_that_writes(tmp_path: Path) -> None:
    io = {"inputs": tables(("x", "FP32", [2])), "outputs": tables(("z", "FP32", [2]))}
    model = loaded_torch(torch_file(tmp_path, InPlace()), **io)
    assert not model.zero_copy
    x = frozen(np.ones(2, np.float32))
    assert np.asarray(model.predict({"x": x}, {})["z"]).tolist() == [3.0, 3.0]
    assert x.tolist() == [1.0, 1.0]


def test_in_place_ops_are_found_in_the_graph() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert writes_in_place(torch.jit.script(InPlace()))
        assert not writes_in_place(torch.jit.script(Doubler()))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "t/config.toml: declare the model's inputs and outputs"),
        ({"inputs": DOUBLER_IO["inputs"]}, "declare the model's outputs"),
        (
            {**DOUBLER_IO, "inputs": tables(("x", "FP32", [-1, 3]))},
            r"declares 1 input\(s\), but forward takes \(x, y\)",
        ),
        (
            {**DOUBLER_IO, "inputs": [{"name": "x", "dtype": "FP32"}]},
            r"inputs\[0\].shape is missing",
        ),
        (
            {**DOUBLER_IO, "outputs": tables(("s", "BYTES", [-1]))},
            "s is BYTES; torch has none",
        ),
        (
            {**DOUBLER_IO, "outputs": tables(("twice", "FP32", [-1, 3]))},
            r"forward returned 2 tensor\(s\); config.toml declares 1 output\(s\): twice",
        ),
        (
            {**DOUBLER_IO, "outputs": tables(("a", "FP32", [-1, 4]), ("b", "INT64", [-1]))},
            r"output a is declared \[-1, 4\], but a trial run on one row gave shape \[1, 3\]",
        ),
        (
            {**DOUBLER_IO, "inputs": tables(("x", "FP32", [-1, 3]), ("y", "INT64", [-1]))},
            "a trial run on zeros of the shapes in t/config.toml failed",
        ),
    ],
)
def test_torchscript_config_errors_show_at_load(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    path = torch_file(tmp_path, Doubler())
    with pytest.raises(ModelFileError, match=message):
        loaded_torch(path, **options)


def test_torchscript_refuses_a_file_that_is_not_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "t" / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    torch.save({"weight": torch.zeros(2)}, path)
    with pytest.raises(ModelFileError, match=r"t/1/model\.pt is not a TorchScript module"):
        loaded_torch(path, **DOUBLER_IO)


def test_broken_reports_its_reason() -> None:
    with pytest.raises(ModelFileError, match="m/ has no version directory"):
        Broken({"reason": "m/ has no version directory"}).load()


# -- the digits classifier in three runtimes -------------------------------------------


def test_three_runtimes_of_digits_agree_on_the_holdout() -> None:
    entries = {entry["name"]: entry["options"] for entry in scan(EXAMPLES)}
    models = {
        "numpy": Digits({}),
        "onnx": OnnxModel(entries["digits_onnx"]),
        "torchscript": TorchScriptModel(entries["digits_torch"]),
    }
    with np.load(HOLDOUT) as data:
        pixels, labels = frozen(data["X"].astype(np.float32)), data["y"]
    results = {}
    for name, model in models.items():
        model.load()
        results[name] = np.asarray(model.predict({"pixels": pixels}, {})["probabilities"])
    reference = results["numpy"]
    assert int((reference.argmax(axis=1) == labels).sum()) == 349  # of 360
    for name in ("onnx", "torchscript"):
        assert np.array_equal(results[name].argmax(axis=1), reference.argmax(axis=1)), name
        assert np.abs(results[name] - reference).max() < 1e-5, name
