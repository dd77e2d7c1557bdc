"""Write docs/reference/triton-model-config.md: what the appliance does with each
field of Triton's ModelConfig.

Usage: ``python tools/model_config_coverage.py [--check]``.

The fields come from the schema itself, the ModelConfig descriptor of
``appliance._generated.triton_model_config_pb2`` (built from
``protos/triton_model_config.proto``), walked into every message it reaches;
a field is named by its dotted path (``dynamic_batching.default_queue_policy.
timeout_action``; a map of messages, such as ``parameters``, continues into
its value's fields). The statuses are :data:`TABLE` below, written from what
``appliance/formats/triton/config_pbtxt.py`` does with each field: read into the model's settings
(served), a ``PbtxtError`` naming it (refused), or one of its notes, which the
model's worker logs once at load (logged and ignored); two fields are read
by nothing and noted by nothing (silently ignored). A row of :data:`SUBTREES`
stands for the fields under it too, a row below it saying otherwise for its
own part; any other row places its own path alone.

The generator stops, naming the path, when a field of the schema is placed by
no row (the proto gained one), when a row names a path the schema no longer
has, and when a top-level row contradicts pbtxt.py's own lists (a field it
refuses, or notes as unused, that the table calls otherwise), so the page
cannot fall behind either. ``--check`` also compares with the committed page
instead of writing it (``make docs-check``, run by ``make lint``; a unit test
too).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance._generated import triton_model_config_pb2 as mc  # noqa: E402
from appliance.formats.triton import config_pbtxt as pbtxt  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "triton-model-config.md"
PROTO = "protos/triton_model_config.proto"

SERVED = "served"
REFUSED = "refused"
NOTED = "logged and ignored"
# Read by nothing and named in no note: a status of its own so that the page
# does not claim a log line the appliance never writes.
SILENT = "silently ignored"
STATUSES = (SERVED, REFUSED, NOTED, SILENT)

_ENSEMBLE_NOTE = "noted for an ensemble (its steps' models have their own)"

# path -> (status, what the appliance does and why). A row covers its subtree
# unless a deeper row places part of it. Every "logged and ignored" row says
# why a client's answers do not change.
TABLE: dict[str, tuple[str, str]] = {
    "name": (
        SERVED,
        "Must equal the model's directory name, as Triton requires; a different one is "
        "refused at load.",
    ),
    "platform": (
        SERVED,
        "onnxruntime_onnx and pytorch_libtorch pick the ONNX Runtime and TorchScript "
        "runtimes, ensemble makes an ensemble; any other platform has no runtime here and "
        "is refused at load.",
    ),
    "version_policy": (
        SERVED,
        "latest (the num_versions newest version directories), all, or specific versions "
        "(an empty or negative list is refused).",
    ),
    "max_batch_size": (
        SERVED,
        "Above 0 the model batches and dims exclude the batch dimension, as in Triton.",
    ),
    "input": (SERVED, "The model's declared inputs, in its metadata."),
    "input.name": (SERVED, "Required: an input without one is refused."),
    "input.data_type": (SERVED, "TYPE_STRING is BYTES; TYPE_BF16 and TYPE_INVALID are refused."),
    "input.format": (
        NOTED,
        "A layout label (NHWC, NCHW) Triton passes to backends and image clients; tensors "
        "reach the model as clients send them, in both servers.",
    ),
    "input.dims": (SERVED, "The shape clients send; -1 is any size."),
    "input.reshape": (SERVED, "The model sees the reshape shape, clients the dims."),
    "input.is_shape_tensor": (REFUSED, "Shape tensors (a TensorRT notion) have no runtime here."),
    "input.allow_ragged_batch": (
        REFUSED,
        "Ragged batching (requests of different shapes in one batch) is not served.",
    ),
    "input.optional": (SERVED, "A client may leave the input out; the model is called without it."),
    "input.is_non_linear_format_io": (
        NOTED,
        "TensorRT's non-linear I/O formats; the appliance has no TensorRT runtime and "
        "tensors stay row-major, as clients send and receive them.",
    ),
    "output": (SERVED, "The model's declared outputs, in its metadata."),
    "output.name": (SERVED, "Required: an output without one is refused."),
    "output.data_type": (SERVED, "TYPE_STRING is BYTES; TYPE_BF16 and TYPE_INVALID are refused."),
    "output.dims": (SERVED, "The shape clients receive; -1 is any size."),
    "output.label_filename": (
        NOTED,
        "Labels serve only Triton's classification extension, which the appliance "
        "refuses per request (the classification parameter), so an output is always "
        "answered as its values.",
    ),
    "output.reshape": (SERVED, "The model returns the reshape shape, clients get the dims."),
    "output.is_shape_tensor": (REFUSED, "Shape tensors (a TensorRT notion) have no runtime here."),
    "output.is_non_linear_format_io": (
        NOTED,
        "TensorRT's non-linear I/O formats; tensors stay row-major.",
    ),
    "instance_group": (
        SERVED,
        "How many model instances run, and on which device; groups on the CPU and on GPUs "
        "at once are refused.",
    ),
    "instance_group.name": (
        SILENT,
        "A label for Triton's own instance names; the appliance names its workers after "
        "the model and reads it nowhere.",
    ),
    "instance_group.count": (
        SERVED,
        "Summed over the groups (at least one each, times the GPUs a group lists).",
    ),
    "instance_group.gpus": (
        SERVED,
        "One GPU index places the instances on it; none spreads them over all GPUs (noted: "
        "Triton runs count on each); several GPUs, or a negative index, are refused.",
    ),
    "instance_group.kind": (
        SERVED,
        "KIND_CPU and KIND_GPU; KIND_AUTO is noted and runs on the CPU; KIND_MODEL is refused.",
    ),
    "instance_group.profile": (
        NOTED,
        "TensorRT optimization profiles; there is no TensorRT runtime here.",
    ),
    "instance_group.rate_limiter": (
        NOTED,
        "Triton's rate limiter orders instances by resources and priority (and only when "
        "started with --rate-limit); here each instance takes the next request when it is "
        "free. Which instance runs a request changes, not its answer.",
    ),
    "instance_group.passive": (
        NOTED,
        "Triton loads passive instances but schedules nothing on them; here every instance "
        "serves. Throughput changes, not answers.",
    ),
    "instance_group.secondary_devices": (
        NOTED,
        "NVDLA devices for TensorRT; there is no TensorRT runtime here.",
    ),
    "instance_group.host_policy": (
        NOTED,
        "Triton's host policies (NUMA binding, set on its command line); placement only.",
    ),
    "default_model_filename": (
        SERVED,
        "The file in each version directory (model.onnx, model.pt, model.py by default).",
    ),
    "cc_model_filenames": (
        NOTED,
        "A file per GPU compute capability; the appliance loads default_model_filename on "
        "every GPU. Answers differ only where those files hold different models.",
    ),
    "metric_tags": (
        NOTED,
        "Extra labels for the model's metrics; the appliance's series carry model and "
        "version labels only. Inference answers do not change; a metrics scraper matching "
        "on such a label finds none.",
    ),
    "dynamic_batching": (
        SERVED,
        "Requests wait in each instance's queue to be batched; " + _ENSEMBLE_NOTE + ".",
    ),
    "dynamic_batching.preferred_batch_size": (
        SERVED,
        "With a queue delay, a batch is sent as soon as it reaches a preferred size.",
    ),
    "dynamic_batching.max_queue_delay_microseconds": (
        SERVED,
        "How long a request may wait for others to batch with.",
    ),
    "dynamic_batching.preserve_ordering": (
        NOTED,
        "Each request's answer goes to its own caller as soon as it is ready; a gRPC "
        "stream answers its requests one after another, so in order anyway.",
    ),
    "dynamic_batching.priority_levels": (
        SERVED,
        "A request's priority parameter picks its level (1 is the highest); one out of "
        "range is refused.",
    ),
    "dynamic_batching.default_priority_level": (SERVED, "The level of a request that names none."),
    "dynamic_batching.default_queue_policy": (
        SERVED,
        "All four fields: max_queue_size (a full queue refuses, 503 / UNAVAILABLE), "
        "default_timeout_microseconds, timeout_action REJECT or DELAY, and "
        "allow_timeout_override (a request's timeout may shorten its wait).",
    ),
    "dynamic_batching.priority_queue_policy": (
        SERVED,
        "The same four fields, for one priority level.",
    ),
    "sequence_batching": (
        SERVED,
        "Stateful sequences for ONNX, TorchScript and Python-backend models, decoupled ones "
        "too (a decoupled model's implicit state is refused); " + _ENSEMBLE_NOTE + ".",
    ),
    "sequence_batching.max_sequence_idle_microseconds": (
        SERVED,
        "A sequence idle this long is ended and its slot freed.",
    ),
    "sequence_batching.control_input": (
        SERVED,
        "START, END, READY and CORRID controls the worker fills on each step, in their "
        "int32, fp32 or bool false/true values or, for CORRID, data_type (INT32, INT64, "
        "UINT32, UINT64 or STRING); Triton's rules on them are checked at load.",
    ),
    "sequence_batching.direct": (SERVED, "One slot per sequence (the default strategy)."),
    "sequence_batching.direct.max_queue_delay_microseconds": (
        SERVED,
        "How long a step waits for other sequences' steps to batch with.",
    ),
    "sequence_batching.direct.minimum_slot_utilization": (
        NOTED,
        "Triton may hold a batch until this share of slots is filled; here a batch runs "
        "after the queue delay. Batch sizes and latency change, not answers.",
    ),
    "sequence_batching.oldest": (SERVED, "Steps of the oldest sequences are batched together."),
    "sequence_batching.oldest.max_candidate_sequences": (
        SERVED,
        "How many sequences may be batched at once.",
    ),
    "sequence_batching.oldest.max_queue_delay_microseconds": (
        SERVED,
        "How long a step waits for other sequences' steps to batch with.",
    ),
    "sequence_batching.oldest.preferred_batch_size": (
        NOTED,
        "Batch sizes change, not answers: each sequence's steps still run in order.",
    ),
    "sequence_batching.oldest.preserve_ordering": (
        NOTED,
        "A sequence's steps run and are answered in order anyway; answers to different "
        "sequences go to their own callers.",
    ),
    "sequence_batching.state": (
        SERVED,
        "Implicit state kept per sequence: input_name gets the output_name the model "
        "returned on the previous step, in data_type and dims.",
    ),
    "sequence_batching.state.input_name": (
        SERVED,
        "The model input that gets the state; clients do not send it.",
    ),
    "sequence_batching.state.output_name": (
        SERVED,
        "The model output kept as the next step's state; a client gets it only when "
        "output lists it, as in Triton.",
    ),
    "sequence_batching.state.data_type": (
        SERVED,
        "The state's type; TYPE_BF16 and TYPE_INVALID are refused.",
    ),
    "sequence_batching.state.dims": (
        SERVED,
        "The state's shape; -1 lets it change size from step to step.",
    ),
    "sequence_batching.state.initial_state": (
        SERVED,
        "The first step's state: data_type and dims (checked against the state's), "
        "zero_data, or data_file in the model directory's initial_state/.",
    ),
    "sequence_batching.state.initial_state.name": (
        SILENT,
        "A label Triton uses in its messages; the appliance names the state by its "
        "input_name instead.",
    ),
    "sequence_batching.state.use_same_buffer_for_input_output": (
        NOTED,
        "A memory layout choice; here the state is a copy per step, the same values.",
    ),
    "sequence_batching.state.use_growable_memory": (
        NOTED,
        "A memory layout choice; here the state is a copy per step, the same values.",
    ),
    "sequence_batching.iterative_sequence": (
        REFUSED,
        "Iterative sequences (the model re-run on its own output) are not served.",
    ),
    "ensemble_scheduling": (
        SERVED,
        'An ensemble\'s steps (platform "ensemble"); on any other model it is refused.',
    ),
    "ensemble_scheduling.step": (
        SERVED,
        "model_name, model_version (-1 the newest), input_map and output_map, run as "
        "appliance/config/ensembles.py runs a TOML ensemble.",
    ),
    "ensemble_scheduling.step.model_namespace": (
        NOTED,
        "Model names are one namespace here; a step finds its model by name, as without "
        "namespacing in Triton.",
    ),
    "ensemble_scheduling.max_inflight_requests": (
        NOTED,
        "Triton's bound on requests in flight between steps (memory); answers do not change.",
    ),
    "optimization": (
        NOTED,
        "Backend tuning (graph level, CUDA graphs, execution accelerators, pinned memory, "
        "eager batching, priority): the runtimes run with their defaults. One caveat: an "
        "accelerator set to lower precision (TensorRT FP16) gives slightly different "
        "numbers in Triton than the full-precision answers here.",
    ),
    "parameters": (
        SERVED,
        "intra_op_thread_count (a whole number >= 1) sets ONNX Runtime's and TorchScript's "
        "intra-op threads; any other key is noted, though a Python-backend model reads "
        "them all in args['model_config'], as in Triton (EXECUTION_ENV_PATH is not acted "
        "on: the model runs in the appliance's Python).",
    ),
    "model_warmup": (
        SERVED,
        "Every field: each sample (name, batch_size, count, inputs of zero_data, "
        "random_data or input_data_file) runs before the model is ready; refused for a "
        "sequence model; " + _ENSEMBLE_NOTE + ".",
    ),
    "backend": (
        SERVED,
        "onnxruntime, pytorch and python pick a runtime; any other backend has no runtime "
        "here and is refused at load.",
    ),
    "model_operations": (
        NOTED,
        "Custom operation libraries are not loaded: a model that needs one fails to load "
        "in its runtime, with that runtime's error, rather than answering differently.",
    ),
    "model_transaction_policy": (
        SERVED,
        "decoupled: a Python-backend model.py answers through its response sender, over "
        "a stream; refused for a model file and for an ensemble.",
    ),
    "batch_input": (REFUSED, "Batch inputs (Triton's ragged batching) are not served."),
    "batch_output": (REFUSED, "Batch outputs (Triton's ragged batching) are not served."),
    "model_repository_agents": (
        NOTED,
        "Triton's repository agents (checksum, decryption, ...) act on a model's files "
        "before load; the appliance loads the files as they are.",
    ),
    "response_cache": (
        SERVED,
        "enable: a repeated request is answered from the frontend's LRU cache; refused "
        "for sequence and decoupled models; " + _ENSEMBLE_NOTE + ".",
    ),
    "runtime": (
        NOTED,
        "Names Triton's backend library; the appliance picks its runtime from platform or backend.",
    ),
    "model_metrics": (
        NOTED,
        "Histogram buckets for Triton's first-response histogram, a series the appliance "
        "does not export.",
    ),
}


# Rows that place every field under them too (the fields a row's words name,
# or a subtree wholly one status). Any other row places its own path alone, so
# a field the proto gains inside, say, sequence_batching has no row until one
# is written, rather than being taken as served with its parent.
SUBTREES = frozenset(
    {
        "version_policy",
        "input.reshape",
        "output.reshape",
        "instance_group.rate_limiter",
        "instance_group.secondary_devices",
        "dynamic_batching.default_queue_policy",
        "dynamic_batching.priority_queue_policy",
        "sequence_batching.control_input",
        "sequence_batching.state.initial_state",
        "ensemble_scheduling.step",
        "optimization",
        "parameters",
        "model_warmup",
        "model_operations",
        "model_transaction_policy",
        "batch_input",
        "batch_output",
        "model_repository_agents",
        "response_cache",
        "model_metrics",
    }
)


class CoverageError(ValueError):
    """The table and the schema (or pbtxt.py) disagree; the message names the path."""


def schema_paths(descriptor: Any = None, prefix: str = "") -> Iterator[tuple[str, bool]]:
    """Every field path of ModelConfig in the proto's order, with whether it is a leaf.

    A message field is an inner node and its fields follow it; a map of
    messages continues into its value's fields; a map of scalars is a leaf.
    A message type already on the path is not entered again (the schema has
    no cycle today; this keeps a future one from looping).
    """
    yield from _walk(descriptor or mc.ModelConfig.DESCRIPTOR, prefix, ())


def _walk(descriptor: Any, prefix: str, seen: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    seen = (*seen, descriptor.full_name)
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        inner = field.message_type
        if inner is not None and inner.GetOptions().map_entry:
            inner = inner.fields_by_name["value"].message_type
        if inner is None or inner.full_name in seen:
            yield path, True
        else:
            yield path, False
            yield from _walk(inner, f"{path}.", seen)


def placing_row(
    path: str, table: Mapping[str, tuple[str, str]], subtrees: frozenset[str] = SUBTREES
) -> str | None:
    """The row that places ``path``: its own, else its nearest ancestor's that is
    one of ``subtrees``; None when no row does."""
    if path in table:
        return path
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in table and candidate in subtrees:
            return candidate
    return None


def problems(table: Mapping[str, tuple[str, str]] = TABLE) -> list[str]:
    """What keeps ``table`` from placing the schema's fields truthfully; [] when nothing."""
    paths = dict(schema_paths())
    found = [
        f"{path}: a field of ModelConfig that no row places (add a row to TABLE in "
        "tools/model_config_coverage.py)"
        for path, leaf in paths.items()
        if leaf and placing_row(path, table) is None
    ]
    found += [f"{path}: in SUBTREES but no row of TABLE" for path in SUBTREES - set(table)]
    for path, (status, why) in table.items():
        if path not in paths:
            found.append(f"{path}: a row for a field ModelConfig no longer has")
        if status not in STATUSES:
            found.append(f"{path}: status {status!r} is not one of {', '.join(STATUSES)}")
        if not why.strip():
            found.append(f"{path}: a row needs its words")
    return found + _contradictions(table, paths)


def _contradictions(table: Mapping[str, tuple[str, str]], paths: Mapping[str, bool]) -> list[str]:
    """Top-level rows that say otherwise than pbtxt.py's lists of the fields it reads,
    refuses by name, and notes as unused."""
    found = []
    read = pbtxt._USED | pbtxt._ENSEMBLE_USED
    for path in (p for p in paths if "." not in p):
        status = table[path][0] if path in table else None
        if path in pbtxt._REFUSED:
            expected = {REFUSED}
        elif path in read:
            expected = {SERVED}
        else:
            # pbtxt.py notes every set field it does not read; nothing under it is served.
            expected = {NOTED}
            below = [p for p in table if p.startswith(f"{path}.") and table[p][0] != NOTED]
            found += [f"{p}: pbtxt.py does not read {path}, so it is {NOTED}" for p in below]
        if status is not None and status not in expected:
            found.append(f"{path}: pbtxt.py makes it {' or '.join(sorted(expected))}, not {status}")
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(table: Mapping[str, tuple[str, str]] = TABLE) -> str:
    """The page, its rows in the proto's order."""
    trouble = problems(table)
    if trouble:
        raise CoverageError("\n".join(trouble))
    paths = dict(schema_paths())
    counts = {status: 0 for status in STATUSES}
    leaves = {status: 0 for status in STATUSES}
    for path, leaf in paths.items():
        if path in table:
            counts[table[path][0]] += 1
        if leaf:
            leaves[table[placing_row(path, table) or path][0]] += 1
    ensemble = ", ".join(f"`{name}`" for name in sorted(pbtxt._ENSEMBLE_USED))
    lines = [
        "# Triton's ModelConfig, field by field",
        "",
        "<!-- Generated by tools/model_config_coverage.py from "
        f"{PROTO}; make docs-reference rewrites it. -->",
        "",
        "What the appliance does with each field of a model's `config.pbtxt` (Triton's "
        f"ModelConfig, `{PROTO}`), as `appliance/formats/triton/config_pbtxt.py` reads it:",
        "",
        f"- **{SERVED}**: read into the model's settings and acted on as Triton acts on it;",
        f"- **{REFUSED}**: the model fails to load, with the field named in its status;",
        f"- **{NOTED}**: accepted, and named in a note the model's worker logs once at "
        "load; each row says why a client's answers stay the same;",
        f"- **{SILENT}**: accepted and read nowhere, with no note.",
        "",
        "A row marked *and every field in it* stands for the fields under it too, unless "
        "a row of their own says otherwise; a field served on some models only says which. "
        f"An ensemble reads {ensemble}; any other field set on one is {NOTED}, since its "
        "steps' models have their own.",
        "",
        "Two things reach a client whatever the status: Triton's model configuration "
        "endpoint (`/v2/models/<name>/config`, gRPC ModelConfig) answers with a "
        "configuration rebuilt from what the appliance serves, not with the file, so a "
        "field it does not act on is not in that answer; and a Python-backend model's "
        "`initialize` gets the whole `config.pbtxt` in `args['model_config']`, as in "
        "Triton, so it sees every field set.",
        "",
        f"{len(table)} rows: "
        + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
        + f". Of the schema's {sum(leaves.values())} leaf fields, "
        + ", ".join(f"{leaves[s]} are {s}" for s in STATUSES)
        + ".",
        "",
        "| Field | Status | What the appliance does |",
        "| --- | --- | --- |",
    ]
    for path in paths:
        if path in table:
            status, why = table[path]
            name = f"`{path}` and every field in it" if path in SUBTREES else f"`{path}`"
            lines.append(f"| {name} | {status} | {_cell(why)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed page, write nothing"
    )
    args = parser.parse_args(argv)
    try:
        text = render()
    except CoverageError as ex:
        print(f"{PAGE.relative_to(ROOT)}: the table does not match the schema:\n{ex}")
        return 1
    if not args.check:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    committed = PAGE.read_text() if PAGE.exists() else ""
    if committed == text:
        return 0
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        text.splitlines(keepends=True),
        str(PAGE.relative_to(ROOT)),
        "generated",
    )
    sys.stdout.writelines(diff)
    print(f"{PAGE.relative_to(ROOT)} is stale: run make docs-reference")
    return 1


if __name__ == "__main__":
    sys.exit(main())
