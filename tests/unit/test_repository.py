"""The model repository scan and the config's [[repositories]] section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w

from appliance.config.reader import load, read_snapshot
from appliance.config.settings import ConfigError, write_snapshot
from appliance.formats import repository
from appliance.formats.model_versions import parse_versions
from appliance.formats.repository import BROKEN_CLASS, scan
from appliance.formats.repository_layout import ONNX_CLASS, TORCHSCRIPT_CLASS, RepositoryError


def put(root: Path, relative: str, content: bytes | str = b"x") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in entries}


def reason(entry: dict[str, Any]) -> str:
    assert entry["class"] == BROKEN_CLASS, entry
    return str(entry["options"]["reason"])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for version in (1, 2, 10):
        put(root, f"multi/{version}/model.onnx")
    put(root, "torchy/3/model.pt")
    put(
        root,
        "torchy/config.toml",
        'instances = 2\nthreads = 2\ndevice = "cuda:1"\n[[inputs]]\nname = "x"\n',
    )
    put(root, ".hidden/1/model.onnx")
    put(root, "README.md", "not a model")
    return root


def test_latest_is_served_by_default_with_options_for_the_runtime(repo: Path) -> None:
    entries = scan(repo)
    assert [entry["name"] for entry in entries] == ["multi", "torchy"]
    multi, torchy = entries
    assert multi["class"] == ONNX_CLASS
    assert multi["options"]["version"] == "10"
    assert multi["options"]["path"] == str(repo / "multi" / "10" / "model.onnx")
    assert multi["options"]["stamp"].startswith("1:")
    assert torchy["class"] == TORCHSCRIPT_CLASS
    assert torchy["instances"] == 2
    assert torchy["options"]["threads"] == 2
    assert torchy["options"]["inputs"] == [{"name": "x"}]
    assert torchy["device"] == "cuda:1"
    assert "instances" not in torchy["options"]


def test_version_policies(repo: Path) -> None:
    names = [(e["name"], e["options"]["version"]) for e in scan(repo, "all")]
    assert names[:3] == [("multi", "10"), ("multi.v2", "2"), ("multi.v1", "1")]
    chosen = by_name(scan(repo, (1, 2)))
    assert chosen["multi"]["options"]["version"] == "2"
    assert chosen["multi.v1"]["options"]["version"] == "1"
    assert "version(s) 1, 2 of torchy, but it has 3" in reason(chosen["torchy"])


def test_a_model_config_overrides_the_policy(repo: Path) -> None:
    put(repo, "multi/config.toml", "versions = [1]\n")
    assert by_name(scan(repo))["multi"]["options"]["version"] == "1"


def test_a_new_file_is_a_change(repo: Path) -> None:
    before = by_name(scan(repo))["multi"]
    put(repo, "multi/10/model.onnx", b"longer")
    after = by_name(scan(repo))["multi"]
    assert before["options"]["stamp"] != after["options"]["stamp"]
    put(repo, "multi/11/model.onnx")
    assert by_name(scan(repo))["multi"]["options"]["version"] == "11"


STATE = """
sequence_batching = true
[[sequence_state]]
input = "IN_STATE"
output = "OUT_STATE"
dtype = "INT32"
shape = [1]
initial_file = "{file}"
"""


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"m/notes.txt": "x"}, "m/ has no version directory (such as m/1/)"),
        (
            {"m/1/weights.bin": "x"},
            "m/1/ holds no model.onnx or model.pt or model.py (it holds: weights.bin)",
        ),
        ({"m/1/model.onnx": "x", "m/1/model.pt": "x"}, "holds both model.onnx and model.pt"),
        ({"m/1/model.onnx": "x", "m/config.toml": "instances = ["}, "m/config.toml: cannot read"),
        ({"m/1/model.onnx": "x", "m/config.toml": "colour = 1"}, "colour: unknown key"),
        ({"m/1/model.onnx": "x", "m/config.toml": "instances = 0"}, "expected an integer >= 1"),
        ({"m/1/model.onnx": "x", "m/config.toml": "platform = 'tf'"}, "platform: expected one"),
        ({"m/1/model.onnx": "x", "m/config.toml": "versions = 'newest'"}, "versions: expected"),
        ({"m/1/model.onnx": "x", "m/config.toml": "device = 'gpu0'"}, 'device: expected "cpu"'),
        ({"m/1/model.pt": "x", "m/config.toml": "platform = 'onnx'"}, "m/1/ has no model.onnx"),
        (
            {"m/1/model.pt": "x", "m/config.toml": "[[inputs]]\nname = 'x'\nshape = [0.5]"},
            "inputs: [0].shape: expected a list of sizes",
        ),
        (
            {"m/1/model.pt": "x", "m/config.toml": "[[outputs]]\nname = 'y'\nsize = 2"},
            "outputs: [0]: unknown key 'size'",
        ),
        (
            {"m/1/model.onnx": "x", "m/config.toml": STATE.format(file="../../secret")},
            "sequence_state: [0].initial_file: expected a path inside the model directory",
        ),
        (
            {"m/1/model.onnx": "x", "m/config.toml": STATE.format(file="/etc/passwd")},
            "sequence_state: [0].initial_file: expected a path inside the model directory",
        ),
        (
            {"m/1/model.onnx": "x", "m/config.toml": "[[sequence_controls]]\nname = 'S'\n"},
            "sequence_controls: [0]",
        ),
    ],
)
def test_an_unservable_model_becomes_a_broken_entry(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    for relative, content in files.items():
        put(tmp_path, relative, content)
    put(tmp_path, "fine/1/model.onnx")
    entries = by_name(scan(tmp_path))
    assert message in reason(entries["m"])
    assert entries["fine"]["class"] == ONNX_CLASS


def test_a_platform_picks_between_two_files(tmp_path: Path) -> None:
    put(tmp_path, "m/1/model.onnx")
    put(tmp_path, "m/1/model.pt")
    put(tmp_path, "m/config.toml", 'platform = "pytorch_libtorch"\n')
    assert scan(tmp_path)[0]["class"] == TORCHSCRIPT_CLASS


def test_a_missing_repository_or_a_bad_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="cannot read model repository"):
        scan(tmp_path / "nope")
    put(tmp_path, "bad name/1/model.onnx")
    with pytest.raises(RepositoryError, match="'bad name' is not a model name"):
        scan(tmp_path)


@pytest.mark.parametrize("raw", ["newest", [], [-1], [True], 3, None])
def test_bad_version_policies(raw: object) -> None:
    with pytest.raises(RepositoryError):
        parse_versions(raw)


def test_version_policies_parse() -> None:
    assert parse_versions("all") == "all"
    assert parse_versions([3, 1, 3]) == (1, 3)


# -- the config ----------------------------------------------------------------------


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(data))
    return path


def test_config_adds_repository_models_after_its_own(repo: Path, tmp_path: Path) -> None:
    config_path = write_config(
        tmp_path / "appliance.toml",
        {
            "server": {"default_model": "multi"},
            "repositories": [{"path": "models", "versions": [2, 10]}],
            "models": [{"name": "echo", "class": "appliance.demos.echo:Echo"}],
        },
    )
    config = load(config_path)
    assert [model.name for model in config.models] == ["echo", "multi", "multi.v2", "torchy"]
    assert config.repositories[0].path == str(repo)
    assert config.repositories[0].versions == (2, 10)
    torchy = config.model("torchy")
    assert torchy is not None
    assert torchy.cls == BROKEN_CLASS  # the policy asks for versions it lacks
    assert torchy.instances == 1
    write_snapshot(config, tmp_path / "snap.json")
    assert read_snapshot(tmp_path / "snap.json") == config


def test_skip_unavailable_leaves_out_models_whose_runtime_is_not_installed(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # This machine has both runtimes: make torch's package one that is not installed.
    packages = {**repository.RUNTIME_PACKAGES, TORCHSCRIPT_CLASS: ("no_such_package", "torch")}
    monkeypatch.setattr(repository, "RUNTIME_PACKAGES", packages)
    entry = {"path": "models"}
    config_path = write_config(tmp_path / "a.toml", {"repositories": [entry]})
    assert "torchy" in [model.name for model in load(config_path).models]
    config_path = write_config(
        tmp_path / "b.toml", {"repositories": [{**entry, "skip_unavailable": True}]}
    )
    config = load(config_path)
    assert [model.name for model in config.models] == ["multi"]
    assert "model torchy is left out: no_such_package is not installed" in caplog.text
    write_snapshot(config, tmp_path / "snap.json")
    assert read_snapshot(tmp_path / "snap.json") == config


@pytest.mark.parametrize(
    ("repositories", "models", "message"),
    [
        ([{"path": "nope"}], [], r"repositories\[0\]\.path: cannot read model repository"),
        ([{"path": "models", "versions": "x"}], [], r"repositories\[0\]\.versions: expected"),
        ([{"versions": "all"}], [], r"repositories\[0\]\.path: missing"),
        ([{"path": "models", "depth": 1}], [], r"repositories\[0\]\.depth: unknown key"),
        (
            [{"path": "models"}],
            [{"name": "m", "class": "appliance.demos.echo:Echo"}],
            "model name 'm' appears more than once",
        ),
    ],
)
def test_config_errors_name_the_key(
    tmp_path: Path, repositories: list[dict[str, Any]], models: list[Any], message: str
) -> None:
    put(tmp_path, "models/m/1/model.onnx")
    path = write_config(tmp_path / "a.toml", {"repositories": repositories, "models": models})
    with pytest.raises(ConfigError, match=message):
        load(path)


def test_the_example_config_serves_the_example_repository() -> None:
    root = Path(__file__).resolve().parents[2]
    config = load(root / "examples" / "config.toml")
    names = {model.name: model for model in config.models}
    assert names["digits_onnx"].cls == ONNX_CLASS
    assert names["digits_torch"].cls == TORCHSCRIPT_CLASS
    assert names["digits_torch"].options["path"].endswith("digits_torch/1/model.pt")
