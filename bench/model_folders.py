"""The models of each point of bench_models.py, and what each server reads them from.

Apart from the benchmark's runs and measurements because this is only what
gets written before a server starts: copies of the demo repository's ONNX
and TorchScript digits, MLServer's model-settings.json folders, and the
appliance's config naming the same models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.system.harness import make_config, new_run_dir

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
REPOSITORY = ROOT / "appliance" / "demos" / "repository"


def point_models(point: str) -> list[tuple[str, str]]:
    """(name, kind) of every model in a point; kind: simple, onnx or torch."""
    if point == "mixed":
        models = [(f"simple{i}", "simple") for i in range(20)]
        models += [(f"onnx{i}", "onnx") for i in range(4)]
        return models + [(f"torch{i}", "torch") for i in range(4)]
    return [(f"simple{i}", "simple") for i in range(int(point))]


def repository(models: list[tuple[str, str]], where: Path) -> None:
    """Copies of the demo repository's ONNX and TorchScript digits, one per model."""
    sources = {"onnx": "digits_onnx", "torch": "digits_torch"}
    for name, kind in models:
        if kind in sources:
            shutil.copytree(REPOSITORY / sources[kind], where / name)


def mlserver_folders(models: list[tuple[str, str]], repo: Path, home: Path) -> None:
    """A model-settings.json folder in ``home`` for every model, its files in ``repo``."""
    runtimes = {"simple": "Simple", "onnx": "OnnxDigits", "torch": "TorchDigits"}
    files = {"onnx": "1/model.onnx", "torch": "1/model.pt"}
    for name, kind in models:
        body: dict[str, Any] = {
            "name": name,
            "implementation": f"mlserver_many.{runtimes[kind]}",
        }
        if kind in files:
            body["parameters"] = {"uri": str(repo / name / files[kind])}
        Path(home, name).mkdir()
        Path(home, name, "model-settings.json").write_text(json.dumps(body))


def appliance_config(variant: str, models: list[tuple[str, str]], repo: Path) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for name, kind in models:
        if kind == "simple":
            entries.append({"name": name, "class": "appliance.demos.simple:Simple"})
    if variant == "before":
        for entry in entries:
            entry["response_ring_bytes"] = 32 * MiB
    config = make_config(
        new_run_dir(),
        entries,
        server={"model_start": "exec" if variant == "before" else variant, "log_level": "warning"},
        http={"workers": 1},
        grpc={"workers": 1},
        mip={"workers": 1},
    )
    # The shipped defaults (32 MiB rings), not the tests' 8 MiB.
    del config["shm"]
    config["server"]["access_log"] = False
    if any(kind != "simple" for _name, kind in models):
        config["repositories"] = [{"path": str(repo)}]
    return config
