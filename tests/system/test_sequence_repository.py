"""Sequence models from a Triton repository: control inputs and implicit state in config.pbtxt.

The repository holds only config.pbtxt files and model files, written here:
an ONNX accumulator as Triton's implicit state guide describes it (its
output state is its input plus the state, or the input alone on a
sequence's first step), with every kind of control input in each of
Triton's encodings, and a TorchScript one whose state starts from a file
under ``initial_state/`` and whose config lists the state output for
clients to read. tritonclient drives them over gRPC and REST with
``sequence_id``, ``sequence_start`` and ``sequence_end``, interleaving
sequences and running several at once, so steps of different sequences
share batches.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_graph import Graph
from tests.system.harness import Appliance, make_config, new_run_dir, serving

ACCUMULATE_ONNX = """
name: "accumulate_onnx"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "END_SEEN" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "READY_SEEN" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID_SEEN" data_type: TYPE_UINT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "END"
      control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
    }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: {
        data_type: TYPE_INT32
        dims: [ 1 ]
        zero_data: true
        name: "initial state"
      }
    }
  ]
}
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
ACCUMULATE_TORCH = """
name: "accumulate_torch"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID_SEEN" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  oldest { max_candidate_sequences: 4 }
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" }
    }
  ]
}
"""
# The accumulator's file, but its config names a state input the file lacks.
MISNAMED = ACCUMULATE_ONNX.replace('"accumulate_onnx"', '"misnamed"').replace(
    '"INPUT_STATE"', '"MEMORY"'
)
# The accumulator's config, but its file takes START as three values a row.
MISSHAPEN = ACCUMULATE_ONNX.replace('"accumulate_onnx"', '"misshapen"')
START_VALUE = 100


def accumulator(path: Path, start_width: int = 1) -> None:
    """OUTPUT = INPUT + INPUT_STATE * (1 - START); the controls echoed back."""
    graph = Graph("accumulate")
    graph.input("INPUT", np.int32, ["batch", 1])
    graph.input("START", np.int32, ["batch", start_width])
    graph.input("END", np.bool_, ["batch", 1])
    graph.input("READY", np.float32, ["batch", 1])
    graph.input("CORRID", np.uint64, ["batch", 1])
    graph.input("INPUT_STATE", np.int32, ["batch", "state"])
    graph.constant("one", np.array([1], np.int32))
    graph.node("Sub", ["one", "START"], ["not_start"])
    graph.node("Mul", ["INPUT_STATE", "not_start"], ["kept"])
    graph.node("Add", ["INPUT", "kept"], ["OUTPUT"])
    graph.node("Identity", ["OUTPUT"], ["OUTPUT_STATE"])
    for name in ("END", "READY", "CORRID"):
        graph.node("Identity", [name], [f"{name}_SEEN"])
    graph.output("OUTPUT", np.int32, ["batch", 1])
    graph.output("OUTPUT_STATE", np.int32, ["batch", 1])
    graph.output("END_SEEN", np.bool_, ["batch", 1])
    graph.output("READY_SEEN", np.float32, ["batch", 1])
    graph.output("CORRID_SEEN", np.uint64, ["batch", 1])
    graph.save(path)


def torch_accumulator(path: Path) -> None:
    import torch

    class Accumulate(torch.nn.Module):
        def forward(
            self, INPUT: torch.Tensor, CORRID: torch.Tensor, INPUT_STATE: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            total = INPUT + INPUT_STATE
            return total, CORRID, total

    path.parent.mkdir(parents=True)
    with warnings.catch_warnings():
        # Deprecated in favour of torch.export; TorchScript files are what the runtime serves.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(Accumulate()), str(path))


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    root = Path(tempfile.mkdtemp(prefix="seqrepo-", dir="/tmp"))
    for name, text in (("accumulate_onnx", ACCUMULATE_ONNX), ("misnamed", MISNAMED)):
        accumulator(root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(text)
    accumulator(root / "misshapen" / "1" / "model.onnx", start_width=3)
    (root / "misshapen" / "config.pbtxt").write_text(MISSHAPEN)
    torch_dir = root / "accumulate_torch"
    torch_accumulator(torch_dir / "1" / "model.pt")
    (torch_dir / "initial_state").mkdir()
    (torch_dir / "initial_state" / "hundred").write_bytes(np.int32(START_VALUE).tobytes())
    (torch_dir / "config.pbtxt").write_text(ACCUMULATE_TORCH)
    config = make_config(new_run_dir(), [])
    config["repositories"] = [{"path": str(root)}]
    try:
        with serving(config) as started:
            yield started
    finally:
        shutil.rmtree(root, ignore_errors=True)


def step(
    client: Any, module: Any, model: str, value: int, sequence: int | str, start: bool, end: bool
) -> Any:
    tensor = module.InferInput("INPUT", [1, 1] if model == "accumulate_onnx" else [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32).reshape(tensor.shape()))
    return client.infer(
        model, [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end
    )


def test_controls_and_state_follow_each_sequence(appliance: Appliance) -> None:
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    sequences = {1001: [1, 2, 3, 4], 2002: [10, 20, 30, 40]}
    seen: dict[int, list[tuple[int, bool, float, int]]] = {1001: [], 2002: []}
    try:
        for index in range(4):
            # Interleaved, and each sequence's steps alternate between protocols.
            for sequence, values in sequences.items():
                client, module = (grpc, grpcclient) if index % 2 else (rest, httpclient)
                first, last = index == 0, index == len(values) - 1
                result = step(
                    client, module, "accumulate_onnx", values[index], sequence, first, last
                )
                seen[sequence].append(
                    (
                        int(result.as_numpy("OUTPUT")[0, 0]),
                        bool(result.as_numpy("END_SEEN")[0, 0]),
                        float(result.as_numpy("READY_SEEN")[0, 0]),
                        int(result.as_numpy("CORRID_SEEN")[0, 0]),
                    )
                )
                assert result.as_numpy("OUTPUT_STATE") is None
        metadata = grpc.get_model_metadata("accumulate_onnx", as_json=True)
        config = rest.get_model_config("accumulate_onnx")
    finally:
        grpc.close()
        rest.close()
    for sequence, values in sequences.items():
        sums = list(np.cumsum(values))
        ends = [False, False, False, True]
        assert seen[sequence] == [
            (total, end, 1.0, sequence) for total, end in zip(sums, ends, strict=True)
        ]
    # The worker's inputs and the kept state are no part of the interface.
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["INPUT"]
    assert "OUTPUT_STATE" not in [tensor["name"] for tensor in metadata["outputs"]]
    controls = config["sequence_batching"]["control_input"]
    assert [item["name"] for item in controls] == ["START", "END", "READY", "CORRID"]
    assert controls[3]["control"][0]["data_type"] == "TYPE_UINT64"
    assert config["sequence_batching"]["state"][0]["input_name"] == "INPUT_STATE"


def test_concurrent_sequences_share_batches_and_keep_their_sums(appliance: Appliance) -> None:
    url = f"127.0.0.1:{appliance.ports['grpc']}"

    def run(sequence: int) -> list[int]:
        client = grpcclient.InferenceServerClient(url)
        try:
            values = [sequence % 100 + i for i in range(6)]
            return [
                int(
                    step(
                        client, grpcclient, "accumulate_onnx", value, sequence, i == 0, i == 5
                    ).as_numpy("OUTPUT")[0, 0]
                )
                for i, value in enumerate(values)
            ]
        finally:
            client.close()

    ids = [3000 + i for i in range(6)]
    with ThreadPoolExecutor(len(ids)) as pool:
        results = dict(zip(ids, pool.map(run, ids), strict=True))
    for sequence, sums in results.items():
        assert sums == list(np.cumsum([sequence % 100 + i for i in range(6)]))


def test_torchscript_state_starts_from_its_file_and_can_be_read(appliance: Appliance) -> None:
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        results = [
            step(grpc, grpcclient, "accumulate_torch", value, 77, i == 0, i == 2)
            for i, value in enumerate([5, 6, 7])
        ]
        metadata = grpc.get_model_metadata("accumulate_torch", as_json=True)
    finally:
        grpc.close()
    assert [int(r.as_numpy("OUTPUT")[0]) for r in results] == [105, 111, 118]
    # Listed among the outputs, the state output reaches the client too.
    assert [int(r.as_numpy("OUTPUT_STATE")[0]) for r in results] == [105, 111, 118]
    assert [int(r.as_numpy("CORRID_SEEN")[0]) for r in results] == [77, 77, 77]
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["INPUT"]


def test_an_id_the_correlation_control_cannot_hold_is_refused(appliance: Appliance) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        with pytest.raises(InferenceServerException) as raised:
            step(rest, httpclient, "accumulate_onnx", 1, "text-id", True, False)
        after = step(rest, httpclient, "accumulate_onnx", 9, 4004, True, True)
    finally:
        rest.close()
    message = str(raised.value)
    assert "model accumulate_onnx: its correlation id input CORRID is UINT64" in message
    assert "Traceback" not in message
    assert int(after.as_numpy("OUTPUT")[0, 0]) == 9


def test_a_state_the_model_file_lacks_is_named(appliance: Appliance) -> None:
    ready, entry = appliance.kserve_state("misnamed")
    assert not ready
    assert entry["state"] == "UNAVAILABLE"
    reason = entry["reason"]
    assert "sequence_batching.state MEMORY: misnamed/1/model.onnx has no input 'MEMORY'" in reason


def test_a_control_the_model_file_takes_in_another_shape_is_refused_at_load(
    appliance: Appliance,
) -> None:
    ready, entry = appliance.kserve_state("misshapen")
    assert not ready
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "sequence_batching.control_input START: misshapen/1/model.onnx declares shape [-1, 3], "
        "but the worker gives it [-1, 1]"
    ) in entry["reason"]
