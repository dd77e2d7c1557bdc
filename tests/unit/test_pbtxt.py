"""Triton model repositories as they are: config.pbtxt read into [[models]] entries.

Each repository here is written as Triton's documentation writes its
examples (the model configuration guide's identity, simple, dynamic-batching
and sequence configs, and its ensemble); model files are empty stand-ins,
since scanning a repository never opens them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from appliance.formats.repository import BROKEN_CLASS, scan
from appliance.formats.repository_layout import ONNX_CLASS, TORCHSCRIPT_CLASS
from appliance.formats.triton import config_pbtxt as pbtxt


def model(root: Path, name: str, pbtxt: str, files: dict[str, str] | None = None) -> Path:
    folder = root / name
    for version, file_name in (files or {"1": "model.onnx"}).items():
        (folder / version).mkdir(parents=True, exist_ok=True)
        (folder / version / file_name).write_bytes(b"")
    (folder / "config.pbtxt").write_text(pbtxt)
    return folder


def only(root: Path) -> dict[str, Any]:
    entries = scan(root)
    assert len(entries) == 1, entries
    return entries[0]


def reason(entry: dict[str, Any]) -> str:
    assert entry["class"] == BROKEN_CLASS, entry
    return str(entry["options"]["reason"])


IDENTITY = """
name: "identity_fp32"
backend: "onnxruntime"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
instance_group [ { kind: KIND_CPU, count: 2 } ]
dynamic_batching {
  max_queue_delay_microseconds: 500
  preferred_batch_size: [ 4, 8 ]
  default_queue_policy { max_queue_size: 100 }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
"""


def test_an_onnx_model_with_dynamic_batching_maps_every_field(tmp_path: Path) -> None:
    model(tmp_path, "identity_fp32", IDENTITY)
    entry = only(tmp_path)
    assert entry["class"] == ONNX_CLASS
    assert entry["name"] == "identity_fp32"
    assert (entry["instances"], entry["device"], entry["max_batch_size"]) == (2, "cpu", 8)
    assert entry["max_queue_delay_ms"] == 0.5
    options = entry["options"]
    assert options["threads"] == 2
    assert options["inputs"] == [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, -1]}]
    assert options["outputs"] == [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, -1]}]
    assert options["scheduling"] == {
        "preferred_batch_sizes": [4, 8],
        "default_queue_policy": {
            "timeout_action": "reject",
            "default_timeout_us": 0,
            "allow_timeout_override": False,
            "max_queue_size": 100,
        },
    }
    assert "config_notes" not in options


SIMPLE = """
name: "simple"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 1, 16 ] }
]
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }
model_warmup [ {
  name: "zeros" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 1, 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 1, 16 ] random_data: true } }
} ]
"""


def test_an_unbatched_torchscript_model_on_one_gpu(tmp_path: Path) -> None:
    files = {"1": "model.pt", "2": "model.pt", "3": "model.pt"}
    model(tmp_path, "simple", SIMPLE, files)
    entries = scan(tmp_path)
    assert [e["name"] for e in entries] == ["simple", "simple.v1"]
    entry = entries[0]
    assert entry["class"] == TORCHSCRIPT_CLASS
    assert (entry["instances"], entry["device"], entry["max_batch_size"]) == (1, "cuda:0", 0)
    assert entry["options"]["version"] == "3"
    assert entry["options"]["inputs"][0] == {"name": "INPUT0", "dtype": "INT32", "shape": [1, 16]}
    assert entry["options"]["outputs"][1]["dtype"] == "BYTES"
    notes = entry["options"]["config_notes"]
    assert entry["options"]["warmup"] == [
        {
            "name": "zeros",
            "batch_size": 1,
            "count": 0,
            "inputs": [
                {"name": "INPUT0", "dtype": "INT32", "dims": [1, 16], "data": "zero"},
                {"name": "INPUT1", "dtype": "INT32", "dims": [1, 16], "data": "random"},
            ],
        }
    ]
    assert "simple/config.pbtxt: optimization is not used by the appliance" in notes


def test_latest_versions_and_a_named_model_file(tmp_path: Path) -> None:
    files = {"1": "weights.onnx", "2": "weights.onnx", "7": "weights.onnx"}
    model(
        tmp_path,
        "m",
        'platform: "onnxruntime_onnx" default_model_filename: "weights.onnx"\n'
        "version_policy { latest { num_versions: 2 } }",
        files,
    )
    entries = scan(tmp_path)
    assert [(e["name"], e["options"]["version"]) for e in entries] == [("m", "7"), ("m.v2", "2")]
    assert entries[0]["options"]["path"].endswith("m/7/weights.onnx")


SEQUENCE = """
name: "sequence"
backend: "onnxruntime"
max_batch_size: 2
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 100 }
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def test_sequence_batching_with_its_strategy(tmp_path: Path) -> None:
    model(tmp_path, "sequence", SEQUENCE)
    entry = only(tmp_path)
    assert entry["class"] == ONNX_CLASS
    assert entry["sequence_batching"] is True
    assert (entry["max_sequence_idle_s"], entry["sequence_strategy"]) == (5.0, "oldest")
    assert (entry["max_candidate_sequences"], entry["max_queue_delay_ms"]) == (4, 0.1)


# Triton's sequence batcher guide: "direct" with START and READY as FP32 flags,
# "oldest" with a UINT64 correlation id, and its implicit state guide's state.
CONTROLLED = """
name: "controlled"
platform: "onnxruntime_onnx"
max_batch_size: 2
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 3 ] data_file: "initial_state_data" }
      use_same_buffer_for_input_output: true
    }
  ]
}
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 100, 100 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


def test_control_inputs_and_state_become_the_runtimes_tables(tmp_path: Path) -> None:
    folder = model(tmp_path, "controlled", CONTROLLED)
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "initial_state_data").write_bytes(bytes(12))
    entry = only(tmp_path)
    assert entry["class"] == ONNX_CLASS
    assert entry["sequence_batching"] is True
    assert entry["options"]["sequence_controls"] == [
        {"name": "START", "kind": "start", "dtype": "FP32", "false_true": [0.0, 1.0]},
        {"name": "READY", "kind": "ready", "dtype": "FP32", "false_true": [0.0, 1.0]},
        {"name": "END", "kind": "end", "dtype": "BOOL", "false_true": [False, True]},
        {"name": "CORRID", "kind": "corrid", "dtype": "UINT64"},
    ]
    assert entry["options"]["sequence_state"] == [
        {
            "input": "INPUT_STATE",
            "output": "OUTPUT_STATE",
            "dtype": "INT32",
            "shape": [-1],
            "initial_shape": [3],
            "initial_file": "initial_state/initial_state_data",
        }
    ]
    assert entry["options"]["config_notes"] == [
        "controlled/config.pbtxt: sequence_batching.state[0] (INPUT_STATE)."
        "use_same_buffer_for_input_output is not used (the state is a copy per step)"
    ]


def test_an_initial_state_file_replaced_in_place_is_a_change(tmp_path: Path) -> None:
    folder = model(tmp_path, "controlled", CONTROLLED)
    (folder / "initial_state").mkdir()
    data = folder / "initial_state" / "initial_state_data"
    data.write_bytes(bytes(12))
    before = only(tmp_path)["options"]["stamp"]
    data.write_bytes(bytes(range(12)))
    stat = data.stat()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert only(tmp_path)["options"]["stamp"] != before
    model_file = next(folder.glob("1/model.*"))
    assert only(tmp_path)["options"]["stamp"].startswith(f"{model_file.stat().st_size}:")


def test_config_toml_declares_the_same_tables(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"")
    (folder / "config.toml").write_text(
        "[[sequence_controls]]\nname = 'START'\nkind = 'start'\n"
        "[[sequence_state]]\ninput = 'S_IN'\noutput = 'S_OUT'\ndtype = 'FP32'\nshape = [4]\n"
    )
    entry = only(tmp_path)
    assert entry["sequence_batching"] is True
    assert entry["options"]["sequence_controls"] == [{"name": "START", "kind": "start"}]
    (folder / "config.toml").write_text(
        "sequence_batching = false\n[[sequence_controls]]\nname = 'START'\nkind = 'start'\n"
    )
    assert "sequence_batching: false, but sequence_controls" in reason(only(tmp_path))
    (folder / "config.toml").write_text("[[sequence_controls]]\nname = 'START'\nkind = 'begin'\n")
    assert "sequence_controls: [0].kind: expected one of start, end, ready, corrid" in reason(
        only(tmp_path)
    )


ENSEMBLE = """
name: "m"
platform: "ensemble"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "RAW" value: "IN" }
      output_map { key: "PIXELS" value: "pixels" }
    }
  ]
}
"""


def test_an_ensemble_is_its_steps_and_declared_tensors(tmp_path: Path) -> None:
    model(tmp_path, "m", ENSEMBLE, files={"1": ".keep"})
    entry = only(tmp_path)
    assert entry == {
        "name": "m",
        "platform": "ensemble",
        "max_batch_size": 1,
        "inputs": [{"name": "IN", "dtype": "BYTES", "shape": [-1, 1]}],
        "outputs": [{"name": "OUT", "dtype": "FP32", "shape": [-1, 10]}],
        "steps": [
            {
                "model": "preprocess",
                "version": -1,
                "input_map": {"RAW": "IN"},
                "output_map": {"PIXELS": "pixels"},
            }
        ],
        "version": "1",
    }


def test_what_an_ensemble_does_not_use_is_noted(tmp_path: Path) -> None:
    text = ENSEMBLE + "instance_group [ { count: 2 } ]\nparameters { key: 'k' value: {} }\n"
    model(tmp_path, "m", text, files={"3": ".keep"})
    entry = only(tmp_path)
    assert entry["version"] == "3"
    assert entry["config_notes"] == [
        "m/config.pbtxt: instance_group is not used by an ensemble (its steps' models have theirs)",
        "m/config.pbtxt: parameters is not used by an ensemble (its steps' models have theirs)",
    ]


@pytest.mark.parametrize(
    ("pbtxt", "expected"),
    [
        (
            "ensemble_scheduling { step [ { model_name: 'a' } ] }",
            'ensemble_scheduling: only an ensemble (platform: "ensemble") has steps',
        ),
        ('platform: "ensemble"', "ensemble_scheduling.step: an ensemble needs at least one step"),
        ('backend: "tensorflow"', "backend: 'tensorflow' has no runtime here"),
        ('backend: "python"', "m/1/ has no model.py (platform python)"),
        (
            'backend: "python" model_transaction_policy { decoupled: true } sequence_batching '
            "{ state [ { input_name: 'A' output_name: 'B' data_type: TYPE_INT32 dims: [1] } ] }",
            "sequence_batching.state: a decoupled model's implicit state is not carried "
            "(keep a sequence's state in the model, by request.correlation_id())",
        ),
        ('platform: "tensorrt_plan"', "platform: 'tensorrt_plan' has no runtime here"),
        ('name: "other"', "name: 'other' is not its directory's name 'm'"),
        (
            "max_batch_size: 4 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 2 ] "
            "reshape: { shape: [ 3 ] } } ]",
            "input[0] (x).reshape.shape: [3] does not hold the elements of dims [2]",
        ),
        (
            "input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] "
            "reshape: { shape: [ -1, -1 ] } } ]",
            "input[0] (x).reshape.shape: [-1, -1]: sizes >= 0 and at most one -1 are served",
        ),
        (
            "input [ { name: 'x' data_type: TYPE_FP32 dims: [ 2 ] allow_ragged_batch: true } ]",
            "input[0] (x).allow_ragged_batch: not served",
        ),
        (
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 } ",
            "dynamic_batching.default_priority_level: 0 is not a level of 1 to 2",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] } ",
            "dynamic_batching.preferred_batch_size: 8 exceeds max_batch_size 4",
        ),
        (
            "model_warmup [ { name: 'w' batch_size: 2 inputs { key: 'x' value: "
            "{ data_type: TYPE_FP32 dims: [ 1 ] input_data_file: 'nope.bin' } } } ]",
            "model_warmup[0] (w).batch_size: 2, but the model does not batch",
        ),
        (
            "input [ { name: 'x' data_type: TYPE_BF16 dims: [ 2 ] } ]",
            "input[0] (x).data_type: TYPE_BF16 is not one of the appliance's types",
        ),
        ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
        (
            "instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] } ]",
            "instance_group.gpus: instances on GPUs [0, 1] are not served",
        ),
        (
            "instance_group [ { kind: KIND_GPU }, { kind: KIND_CPU } ]",
            "instance_group: groups on the CPU and on GPUs at once",
        ),
        (
            "sequence_batching { control_input [ { name: 'START' } ] }",
            "sequence_batching.control_input[0] (START).control: expected exactly one control",
        ),
        (
            "sequence_batching { control_input [ { name: 'S' control [ "
            "{ kind: CONTROL_SEQUENCE_START } ] } ] }",
            "sequence_batching.control_input[0] (S): CONTROL_SEQUENCE_START needs one of "
            "int32_false_true, fp32_false_true or bool_false_true",
        ),
        (
            "sequence_batching { control_input [ { name: 'S' control [ "
            "{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ] } ] } ] }",
            "sequence_batching.control_input[0] (S).int32_false_true: expected [false, true]",
        ),
        (
            "sequence_batching { control_input [ { name: 'C' control [ "
            "{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }",
            "sequence_batching.control_input[0] (C).data_type: CONTROL_SEQUENCE_CORRID is "
            "TYPE_INT32, TYPE_INT64, TYPE_UINT32, TYPE_UINT64 or TYPE_STRING, not TYPE_FP32",
        ),
        (
            "sequence_batching { control_input [ "
            "{ name: 'A' control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },"
            "{ name: 'B' control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }"
            " ] }",
            "sequence_batching.control_input[1] (B): a second CONTROL_SEQUENCE_END control",
        ),
        (
            "input [ { name: 'S' data_type: TYPE_INT32 dims: [ 1 ] } ] "
            "sequence_batching { control_input [ { name: 'S' control [ "
            "{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
            "input[0] (S): it is a sequence_batching.control_input, which the worker fills",
        ),
        (
            "sequence_batching { state [ { input_name: 'I' data_type: TYPE_INT32 } ] }",
            "sequence_batching.state[0].output_name is missing",
        ),
        (
            "sequence_batching { state [ { input_name: 'I' output_name: 'O' "
            "data_type: TYPE_INT32 dims: [ -1 ] initial_state: { data_type: TYPE_INT32 "
            "dims: [ -1 ] zero_data: true } } ] }",
            "sequence_batching.state[0] (I).initial_state.dims: [-1] does not fill the "
            "state's dims [-1]",
        ),
        (
            "sequence_batching { state [ { input_name: 'I' output_name: 'O' "
            "data_type: TYPE_INT32 dims: [ 1 ] initial_state: { data_type: TYPE_FP32 "
            "dims: [ 1 ] zero_data: true } } ] }",
            "sequence_batching.state[0] (I).initial_state.data_type: TYPE_FP32 is not the "
            "state's TYPE_INT32",
        ),
        (
            "sequence_batching { state [ { input_name: 'I' output_name: 'O' "
            "data_type: TYPE_INT32 dims: [ 1 ] initial_state: { data_type: TYPE_INT32 "
            "dims: [ 1 ] data_file: 'nowhere' } } ] }",
            "sequence_batching.state[0] (I).initial_state.data_file: m/initial_state/nowhere "
            "is not there",
        ),
        (
            "sequence_batching { iterative_sequence: true }",
            "sequence_batching.iterative_sequence: not served",
        ),
        ("max_batch_size: [", "it is not a Triton model config"),
        ("no_such_field: 1", "it is not a Triton model config"),
        (
            "parameters { key: 'intra_op_thread_count' value: { string_value: 'many' } }",
            "parameters[intra_op_thread_count]: expected a whole number >= 1",
        ),
    ],
)
def test_what_cannot_be_served_names_its_field(tmp_path: Path, pbtxt: str, expected: str) -> None:
    model(tmp_path, "m", pbtxt)
    assert expected in reason(only(tmp_path))


def test_both_config_files_are_refused(tmp_path: Path) -> None:
    folder = model(tmp_path, "m", 'backend: "onnxruntime"')
    (folder / "config.toml").write_text("max_batch_size = 4\n")
    assert "holds both config.toml and config.pbtxt; keep one" in reason(only(tmp_path))


def test_a_python_backend_model_is_its_version_directory_s_model_py(tmp_path: Path) -> None:
    text = 'backend: "python" input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]'
    model(tmp_path, "py", text, {"1": "model.py"})
    entry = only(tmp_path)
    assert entry["class"] == "appliance.runtimes.python_backend:PythonBackendModel"
    assert entry["options"]["path"].endswith("py/1/model.py")
    # Left unset: the model's auto_complete_config may set it.
    assert "max_batch_size" not in entry


def test_a_config_pbtxt_as_triton_s_json_has_every_field_and_numbers(tmp_path: Path) -> None:
    folder = model(tmp_path, "m", IDENTITY)
    config = pbtxt.as_json(folder / "config.pbtxt")
    assert config["max_batch_size"] == 8
    [tensor] = config["input"]
    assert tensor["data_type"] == "TYPE_FP32"
    assert all(isinstance(d, int) for d in tensor["dims"])
    assert tensor["optional"] is False


def test_a_reshaped_tensor_declares_the_model_s_shape_and_keeps_the_client_s(
    tmp_path: Path,
) -> None:
    text = (
        'platform: "onnxruntime_onnx" max_batch_size: 4 '
        "input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]"
    )
    model(tmp_path, "m", text)
    options = only(tmp_path)["options"]
    # The runtime checks the model file against the model's shape; clients see dims.
    assert options["inputs"] == [{"name": "x", "dtype": "FP32", "shape": [-1, 2, 2]}]
    assert options["reshape"] == {"x": {"client": [-1, 4], "model": [-1, 2, 2]}}
