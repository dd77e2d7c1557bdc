"""The ModelConfig coverage page: up to date, and failing when the schema and the table part."""

from __future__ import annotations

import pytest

from appliance._generated import triton_model_config_pb2 as mc
from tools import model_config_coverage as coverage


def test_the_committed_page_is_what_the_generator_writes() -> None:
    # `make docs-reference` rewrites it; `make docs-check` (make lint) runs the same check.
    committed = coverage.PAGE.read_text()
    assert committed == coverage.render(), (
        f"{coverage.PAGE.relative_to(coverage.ROOT)} is stale: run make docs-reference"
    )


def test_every_field_of_the_schema_is_placed() -> None:
    assert coverage.problems() == []
    paths = dict(coverage.schema_paths())
    # Nested messages and maps of messages are walked into, not only ModelConfig's own fields.
    for deep in (
        "input.reshape.shape",
        "dynamic_batching.default_queue_policy.timeout_action",
        "dynamic_batching.priority_queue_policy.max_queue_size",
        "model_warmup.inputs.random_data",
        "sequence_batching.control_input.control.kind",
        "instance_group.rate_limiter.resources.count",
        "optimization.cuda.graph_spec.graph_lower_bound.input.dim",
        "parameters.string_value",
    ):
        assert paths.get(deep) is True, deep
        assert coverage.placing_row(deep, coverage.TABLE) is not None
    assert set(mc.ModelConfig.DESCRIPTOR.fields_by_name) <= set(paths)


def test_a_field_no_row_places_is_named() -> None:
    # What a proto that gained a field looks like: its path has no row and no ancestor row.
    table = dict(coverage.TABLE)
    del table["sequence_batching.iterative_sequence"]
    del table["runtime"]
    found = coverage.problems(table)
    assert any(p.startswith("sequence_batching.iterative_sequence:") for p in found)
    assert any(p.startswith("runtime:") for p in found)
    with pytest.raises(coverage.CoverageError, match=r"runtime: a field of ModelConfig"):
        coverage.render(table)


def test_a_subtree_row_places_every_field_under_it() -> None:
    assert coverage.placing_row("optimization.cuda.graphs", coverage.TABLE) == "optimization"
    assert coverage.placing_row("instance_group.passive", coverage.TABLE) == (
        "instance_group.passive"
    )


def test_a_row_for_a_field_the_schema_lacks_is_named() -> None:
    table = {**coverage.TABLE, "input.no_such_field": (coverage.SERVED, "words")}
    assert coverage.problems(table) == [
        "input.no_such_field: a row for a field ModelConfig no longer has"
    ]


def test_a_row_that_contradicts_pbtxt_is_named() -> None:
    # batch_input is refused by pbtxt.py, optimization only noted: the table may not say otherwise.
    table = {
        **coverage.TABLE,
        "batch_input": (coverage.NOTED, "words"),
        "optimization.graph": (coverage.SERVED, "words"),
    }
    found = coverage.problems(table)
    assert "batch_input: pbtxt.py makes it refused, not logged and ignored" in found
    assert any(
        p.startswith("optimization.graph: pbtxt.py does not read optimization") for p in found
    )


def test_check_passes_on_the_committed_page() -> None:
    assert coverage.main(["--check"]) == 0
