"""Ensembles as declared: [[models]] tables with steps, Triton's config.pbtxt, and their checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from appliance.config import settings as config_module
from appliance.config.reader import ConfigError, from_dict
from appliance.config.settings import EnsembleStep
from appliance.formats.repository import BROKEN_CLASS

IDENTITY = "appliance.demos.identity:Identity"
TENSOR = {"name": "IN", "dtype": "FP32", "shape": [-1, -1]}


def chain(*steps: dict[str, Any], **keys: Any) -> dict[str, Any]:
    table = {
        "name": "chain",
        "platform": "ensemble",
        "inputs": [TENSOR],
        "outputs": [{**TENSOR, "name": "OUT"}],
        "steps": list(steps),
    }
    table.update(keys)
    return table


def step(model: str, source: str, made: str, **keys: Any) -> dict[str, Any]:
    return {
        "model": model,
        "input_map": {"INPUT0": source},
        "output_map": {"OUTPUT0": made},
        **keys,
    }


TWO = chain(step("identity", "IN", "mid"), step("identity", "mid", "OUT"))


def configured(*tables: dict[str, Any], **sections: Any) -> config_module.ApplianceConfig:
    models = [{"name": "identity", "class": IDENTITY}, *tables]
    return from_dict({"models": models, **sections}, "app.toml", scan_repositories=True)


def test_an_ensemble_is_served_apart_from_the_models_and_survives_a_snapshot() -> None:
    loaded = configured(TWO, server={"default_model": "chain"})
    assert [model.name for model in loaded.models] == ["identity"]
    (ensemble,) = loaded.ensembles
    assert ensemble.steps == (
        EnsembleStep("identity", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}),
        EnsembleStep("identity", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}),
    )
    assert ensemble.inputs == (("IN", "FP32", (-1, -1)),)
    assert from_dict(config_module.to_dict(loaded), "app.toml") == loaded


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (
            chain(step("identity", "IN", "OUT"), step("identity", "IN", "OUT")),
            "steps[1].output_map: 'OUT' is made by steps[0] too",
        ),
        (
            chain(step("identity", "IN", "a"), step("identity", "b", "OUT")),
            "steps[1].input_map: 'b' is neither an input of the ensemble nor made by a step",
        ),
        (
            chain(
                step("identity", "IN", "a"),
                {"model": "identity", "input_map": {"X": "b", "Y": "IN"}, "output_map": {"Z": "c"}},
                step("identity", "c", "b"),
                step("identity", "a", "OUT"),
            ),
            "steps: steps [1, 2] wait on each other's outputs in a cycle",
        ),
        (chain(step("identity", "IN", "IN")), "steps[0].output_map: 'IN' is an input"),
        (chain(step("identity", "IN", "a")), "outputs: 'OUT' is made by no step"),
        (
            chain(step("identity", "IN", "OUT"), inputs=[TENSOR, {**TENSOR, "name": "X"}]),
            "inputs: 'X' is read by no step",
        ),
        (
            chain(
                step("identity", "IN", "OUT"), max_batch_size=4, inputs=[{**TENSOR, "shape": [3]}]
            ),
            "inputs[0].shape: max_batch_size is 4, so the shape starts with the batch dimension -1",
        ),
        (
            chain(step("identity", "IN", "OUT"), inputs=[]),
            "inputs: an ensemble declares its inputs",
        ),
        (chain(step("identity", "IN", "OUT", extra=1)), "steps[0].extra: unknown key"),
        (chain(), "steps: expected a non-empty array"),
        (
            chain(step("identity", "IN", "OUT"), instances=2),
            "instances: unknown key for an ensemble",
        ),
        (chain(step("nowhere", "IN", "OUT")), "steps[0].model: no model 'nowhere' is served"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_key(
    table: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        configured(table)
    assert "app.toml: models[1]" in str(refused.value)
    assert expected in str(refused.value)


def test_a_snapshot_whose_step_model_was_unloaded_still_reads() -> None:
    loaded = configured(TWO)
    data = config_module.to_dict(loaded)
    data["models"] = [table for table in data["models"] if table["name"] != "identity"]
    assert from_dict(data, "snapshot").ensembles == loaded.ensembles


def test_an_ensemble_of_ensembles_and_a_name_taken_twice_are_refused() -> None:
    inner = chain(step("identity", "IN", "OUT"))
    outer = chain(step("chain", "IN", "OUT"), name="outer")
    with pytest.raises(ConfigError, match=r"steps\[0\].model: 'chain' is an ensemble"):
        configured(inner, outer)
    with pytest.raises(ConfigError, match="model name 'identity' appears more than once"):
        configured(chain(step("identity", "IN", "OUT"), name="identity"))


_SEGMENTATION = 'model_name: "segmentation_model"\n      model_version: '
# Triton's architecture guide's ensemble, its segmentation step asking for version 2.
ARCHITECTURE = (
    (Path(__file__).parent.parent / "data" / "triton_architecture_ensemble.pbtxt")
    .read_text()
    .replace(f"{_SEGMENTATION}-1", f"{_SEGMENTATION}2")
)


def repository(root: Path, ensemble: str) -> Path:
    """Triton's architecture guide's ensemble, its three models as ONNX stand-ins."""
    for name in ("image_preprocess_model", "classification_model", "segmentation_model"):
        for version in ("1", "2") if name == "segmentation_model" else ("1",):
            (root / name / version).mkdir(parents=True)
            (root / name / version / "model.onnx").write_bytes(b"")
    (root / "segmentation_model" / "config.toml").write_text('versions = "all"\n')
    (root / "ensemble_model" / "1").mkdir(parents=True)
    (root / "ensemble_model" / "config.pbtxt").write_text(ensemble)
    return root


def test_tritons_architecture_guide_ensemble_serves_from_its_repository(tmp_path: Path) -> None:
    loaded = from_dict(
        {"repositories": [{"path": str(repository(tmp_path, ARCHITECTURE))}]},
        "x",
        scan_repositories=True,
    )
    (ensemble,) = loaded.ensembles
    assert ensemble.name == "ensemble_model"
    assert ensemble.max_batch_size == 1
    assert ensemble.inputs == (("IMAGE", "BYTES", (-1, 1)),)
    assert ensemble.outputs[1] == ("SEGMENTATION", "FP32", (-1, 3, 224, 224))
    # Step 2 asks for version 2: an older version is served as <name>.v<N>.
    models = [step.model for step in ensemble.steps]
    assert models == ["image_preprocess_model", "classification_model", "segmentation_model"]
    assert "segmentation_model" in {model.name for model in loaded.models}


def test_an_older_version_asked_for_goes_to_its_served_name(tmp_path: Path) -> None:
    text = ARCHITECTURE.replace("model_version: 2", "model_version: 1")
    loaded = from_dict(
        {"repositories": [{"path": str(repository(tmp_path, text))}]}, "x", scan_repositories=True
    )
    assert loaded.ensembles[0].steps[2].model == "segmentation_model.v1"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('"classification_model"', '"no_such_model"'), "steps[1].model: no model 'no_such_model'"),
        (
            ("model_version: 2", "model_version: 5"),
            "steps[2].version: model 'segmentation_model' serves version 2, not 5",
        ),
        (
            (
                'value: "preprocessed_image"\n      }\n    },\n    {\n      model_name: "class',
                'value: "IMAGE"\n      }\n    },\n    {\n      model_name: "class',
            ),
            "steps[0].output_map: 'IMAGE' is an input of the ensemble",
        ),
    ],
)
def test_a_repository_ensemble_that_cannot_be_served_is_broken_with_the_reason(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    assert change[0] in ARCHITECTURE
    text = ARCHITECTURE.replace(*change)
    loaded = from_dict(
        {"repositories": [{"path": str(repository(tmp_path, text))}]}, "x", scan_repositories=True
    )
    assert not loaded.ensembles
    (broken,) = [model for model in loaded.models if model.name == "ensemble_model"]
    assert broken.cls == BROKEN_CLASS
    assert broken.options["reason"].startswith(f"ensemble_model/ ensemble: {expected}")


def test_an_ensemble_in_a_repository_config_toml(tmp_path: Path) -> None:
    (tmp_path / "identity" / "1").mkdir(parents=True)
    (tmp_path / "identity" / "1" / "model.onnx").write_bytes(b"")
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "config.toml").write_text(
        'platform = "ensemble"\n'
        'inputs = [{ name = "IN", dtype = "FP32", shape = [-1, -1] }]\n'
        'outputs = [{ name = "OUT", dtype = "FP32", shape = [-1, -1] }]\n'
        "[[steps]]\n"
        'model = "identity"\n'
        'input_map = { INPUT0 = "IN" }\n'
        'output_map = { OUTPUT0 = "OUT" }\n'
    )
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "config.toml").write_text(
        'platform = "ensemble"\ninstances = 2\nsteps = []\n'
    )
    loaded = from_dict({"repositories": [{"path": str(tmp_path)}]}, "x", scan_repositories=True)
    assert [ensemble.name for ensemble in loaded.ensembles] == ["pair"]
    (broken,) = [model for model in loaded.models if model.name == "worker"]
    assert broken.options["reason"].startswith(
        "worker/config.toml: instances: an ensemble has no worker to configure"
    )
