"""Sequence controls and implicit state of ONNX and TorchScript models, loaded in process.

The runtimes take their tables from a repository's config (config.pbtxt's
control_input and state): they check them against the model's tensors,
keep them out of the interface clients see, read an initial state file,
and (TorchScript) put them in the order ``forward`` takes them.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from appliance.runtimes.interface import ModelFileError
from appliance.runtimes.onnx import OnnxModel
from appliance.runtimes.torchscript import TorchScriptModel
from tests.onnx_graph import Graph

CONTROLS = [
    {"name": "START", "kind": "start", "dtype": "BOOL", "false_true": [False, True]},
    {"name": "CORRID", "kind": "corrid", "dtype": "INT64"},
]
STATE = [{"input": "S_IN", "output": "S_OUT", "dtype": "FP32", "shape": [2]}]


def onnx_model(tmp_path: Path, start: type = np.bool_) -> Path:
    graph = Graph("g")
    graph.input("X", np.float32, ["batch", 2])
    graph.input("START", start, ["batch", 1])
    graph.input("CORRID", np.int64, ["batch", 1])
    graph.input("S_IN", np.float32, ["batch", 2])
    graph.node("Add", ["X", "S_IN"], ["Y"])
    graph.node("Identity", ["Y"], ["S_OUT"])
    graph.output("Y", np.float32, ["batch", 2])
    graph.output("S_OUT", np.float32, ["batch", 2])
    path = tmp_path / "m" / "1" / "model.onnx"
    graph.save(path)
    (tmp_path / "m" / "config.pbtxt").write_text("")
    return path


def loaded(cls: Any, path: Path, **options: Any) -> Any:
    model = cls({"path": str(path), "version": "1", **options})
    model.load()
    return model


def test_onnx_keeps_controls_and_state_out_of_its_interface(tmp_path: Path) -> None:
    model = loaded(
        OnnxModel, onnx_model(tmp_path), sequence_controls=CONTROLS, sequence_state=STATE
    )
    assert [spec.name for spec in model.inputs] == ["X"]
    assert [spec.name for spec in model.outputs] == ["Y"]
    assert model.sequence_batching
    assert list(model.sequence_controls) == ["START", "CORRID"]
    produced = model.predict(
        {
            "X": np.ones((1, 2), np.float32),
            "START": np.array([[True]]),
            "CORRID": np.array([[9]], np.int64),
            "S_IN": np.full((1, 2), 2, np.float32),
        },
        {},
    )
    assert np.asarray(produced["S_OUT"]).tolist() == [[3.0, 3.0]]


def test_onnx_control_of_another_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError) as raised:
        loaded(OnnxModel, onnx_model(tmp_path, np.int32), sequence_controls=CONTROLS)
    assert str(raised.value) == (
        "m/config.pbtxt: sequence_batching.control_input START: input START is INT32 in "
        "m/1/model.onnx, the config gives BOOL"
    )


def test_an_initial_state_file_is_read_and_checked(tmp_path: Path) -> None:
    path = onnx_model(tmp_path)
    (tmp_path / "m" / "initial_state").mkdir()
    start = tmp_path / "m" / "initial_state" / "start"
    start.write_bytes(np.array([1.5, -2.0], np.float32).tobytes())
    state = [{**STATE[0], "initial_shape": [2], "initial_file": "initial_state/start"}]
    model = loaded(OnnxModel, path, sequence_controls=CONTROLS, sequence_state=state)
    assert model.sequence_state[0].initial.tolist() == [1.5, -2.0]
    start.write_bytes(bytes(4))
    with pytest.raises(ModelFileError, match="initial state file initial_state/start does not"):
        loaded(OnnxModel, path, sequence_controls=CONTROLS, sequence_state=state)


class Indexed(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return b * c, a + b


def test_torchscript_takes_triton_index_names_in_order(tmp_path: Path) -> None:
    path = tmp_path / "t" / "1" / "model.pt"
    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.script(Indexed()).save(str(path))
    model = loaded(
        TorchScriptModel,
        path,
        inputs=[{"name": "INPUT__0", "dtype": "FP32", "shape": [-1, 2]}],
        outputs=[{"name": "OUTPUT__1", "dtype": "FP32", "shape": [-1, 2]}],
        # The state is forward's second argument and its first result.
        sequence_state=[
            {"input": "STATE__1", "output": "STATE_OUT__0", "dtype": "FP32", "shape": [2]}
        ],
        sequence_controls=[
            {"name": "READY__2", "kind": "ready", "dtype": "FP32", "false_true": [0, 1]}
        ],
    )
    assert [spec.name for spec in model.model_inputs] == ["INPUT__0", "STATE__1", "READY__2"]
    assert [spec.name for spec in model.model_outputs] == ["STATE_OUT__0", "OUTPUT__1"]
    assert [spec.name for spec in model.inputs] == ["INPUT__0"]
    produced = model.predict(
        {
            "INPUT__0": np.ones((1, 2), np.float32),
            "STATE__1": np.full((1, 2), 4, np.float32),
            "READY__2": np.ones((1, 1), np.float32),
        },
        {},
    )
    assert np.asarray(produced["OUTPUT__1"]).tolist() == [[5.0, 5.0]]
    assert np.asarray(produced["STATE_OUT__0"]).tolist() == [[4.0, 4.0]]
