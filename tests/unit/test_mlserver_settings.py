"""MLServer model folders read by MLServer's discovery rules (formats/mlserver/settings.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from appliance.formats import repository
from appliance.formats.mlserver import settings as mlserver_settings
from appliance.formats.mlserver.settings import MLSERVER_CLASS
from appliance.runtimes.interface import ModelFileError


def settings(root: Path, relative: str, body: dict[str, Any]) -> Path:
    path = root / relative / "model-settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in entries}


def test_a_folder_is_walked_for_model_settings_at_any_depth(tmp_path: Path) -> None:
    settings(tmp_path, "a", {"name": "iris", "implementation": "mlserver_sklearn.SKLearnModel"})
    settings(tmp_path, "deep/er/b", {"implementation": "models.Mine"})  # the folder names it
    settings(tmp_path, ".hidden", {"implementation": "models.Mine"})
    found = by_name(repository.scan(tmp_path))
    assert sorted(found) == ["b", "iris"]
    assert found["iris"]["class"] == MLSERVER_CLASS
    assert found["iris"]["options"]["path"] == str(tmp_path / "a" / "model-settings.json")
    assert found["iris"]["options"]["version"] == ""


def test_versions_are_ordered_as_mlserver_orders_them(tmp_path: Path) -> None:
    for version in ("2", "10", "9"):
        body = {"name": "m", "implementation": "x.Y", "parameters": {"version": version}}
        settings(tmp_path, f"m/{version}", body)
    found = by_name(repository.scan(tmp_path))
    # Whole numbers compare as numbers: 10 is the newest and keeps the name.
    assert found["m"]["options"]["version"] == "10"
    assert found["m.v9"]["options"]["version"] == "9"
    assert found["m.v2"]["options"]["version"] == "2"


def test_unreadable_settings_and_a_missing_implementation_serve_as_broken(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model-settings.json").write_text("{not json")
    settings(tmp_path, "none", {"name": "none"})
    found = by_name(repository.scan(tmp_path))
    assert found["bad"]["class"] == repository.BROKEN_CLASS
    assert "bad/model-settings.json: cannot read it" in found["bad"]["options"]["reason"]
    assert "no implementation" in found["none"]["options"]["reason"]


def test_server_settings_give_instances_and_the_rest_is_noted(tmp_path: Path) -> None:
    settings(tmp_path, "m", {"implementation": "x.Y"})
    server = {"parallel_workers": 3, "http_port": 9000, "debug": True, "cors_settings": {}}
    (tmp_path / "settings.json").write_text(json.dumps(server))
    (entry,) = repository.scan(tmp_path)
    assert entry["instances"] == 3
    assert entry["options"]["config_notes"] == [
        "settings.json: not used by the appliance: cors_settings, debug"
    ]


def test_a_triton_repository_is_not_an_mlserver_folder(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"x")
    assert not mlserver_settings.is_mlserver_folder(tmp_path)


def test_without_mlserver_the_model_fails_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from appliance.runtimes.mlserver import MLServerModel

    path = settings(tmp_path, "m", {"implementation": "mlserver_sklearn.SKLearnModel"})
    # None in sys.modules makes the import fail as if mlserver were not installed.
    monkeypatch.setitem(sys.modules, "mlserver.repository.load", None)
    model = MLServerModel({"path": str(path), "version": ""})
    with pytest.raises(ModelFileError, match=r"pip install 'appliance\[mlserver\]'"):
        model.load()


def test_appliance_serve_listens_where_mlserver_start_would(tmp_path: Path) -> None:
    from appliance.formats import command_line as triton_flags

    settings(tmp_path, "m", {"implementation": "x.Y"})
    config = triton_flags.config(["--model-repository", str(tmp_path)])
    ports = (config["http"]["port"], config["grpc"]["port"], config["http"]["metrics_port"])
    assert ports == (8080, 8081, 8082)  # MLServer's defaults
    (tmp_path / "settings.json").write_text(json.dumps({"http_port": 9080, "host": "127.0.0.1"}))
    config = triton_flags.config(["--model-repository", str(tmp_path), "--grpc-port", "9999"])
    assert (config["http"]["port"], config["grpc"]["port"]) == (9080, 9999)
    assert config["server"]["host"] == "127.0.0.1"


def test_an_input_s_own_parameters_reach_the_model_beside_the_request_s() -> None:
    import orjson

    from appliance.protocols.kserve.codec import decode_infer_request

    item = {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x"]}
    body = {
        "parameters": {"content_type": "pd", "timeout": 5},
        "inputs": [
            {**item, "parameters": {"content_type": "str"}},
            {**item, "name": "u", "parameters": {"binary_data_size": None}},
        ],
    }
    request = decode_infer_request(orjson.dumps(body), None, "m")
    assert request.model_parameters() == {
        "content_type": "pd",
        "input_parameters": {"t": {"content_type": "str"}},
    }


def test_what_the_appliance_does_not_do_is_noted_for_the_log(tmp_path: Path) -> None:
    body = {
        "implementation": "x.Y",
        "max_batch_size": 8,
        "max_batch_time": 0.01,
        "parameters": {"environment_tarball": "env.tar.gz"},
    }
    settings(tmp_path, "m", body)
    (entry,) = repository.scan(tmp_path)
    notes = entry["options"]["config_notes"]
    assert [note.split(":")[1].strip() for note in notes] == [
        "parameters.environment_tarball is not used",
    ]
    # Adaptive batching is the batcher's: up to 8 requests, waiting 10 ms at most.
    assert (entry["max_batch_size"], entry["max_queue_delay_ms"]) == (8, 10.0)
    assert entry["options"]["adaptive_batching"] is True
