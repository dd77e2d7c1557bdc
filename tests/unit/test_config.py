"""Config loading: the default config is valid; errors name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config.reader import from_dict, load, read_snapshot
from appliance.config.settings import ConfigError, write_snapshot


def test_the_default_config_serves_the_demo_models() -> None:
    config = load()
    names = [model.name for model in config.models]
    for name in (
        "simple",
        "simple_int8",
        "simple_string",
        "simple_identity",
        "identity",
        "custom_identity_int32",
        "forward",
        "digits",
        "echo",
        "repeat_int32",
        "simple_sequence",
        "simple_dyna_sequence",
        "simple_string_dyna_sequence",
        "digits_preprocess",
        "digits_postprocess",
    ):
        assert name in names
    assert (config.http.port, config.grpc.port) == (8000, 8001)
    assert [(m.port, m.model) for m in config.mip.listeners] == [(8002, "echo")]
    assert config.server.host == "127.0.0.1"
    assert config.server.default_model == "echo"
    # GraphPipe's root serves a model that declares its inputs and outputs.
    assert config.http.graphpipe_model == "digits"
    # Every runtime: the demo repository's ONNX and TorchScript models.
    classes = {model.name: model.cls for model in config.models}
    assert classes["digits_onnx"] == "appliance.runtimes.onnx:OnnxModel"
    assert classes["digits_torch"].startswith("appliance.runtimes.torchscript:")
    # And an ensemble of three of them, from the repository's config.pbtxt.
    ensemble = config.ensemble("digits_ensemble")
    assert ensemble is not None
    steps = ["digits_preprocess", "digits", "digits_postprocess"]
    assert [step.model for step in ensemble.steps] == steps


def test_a_snapshot_reads_back_the_same_config(tmp_path: Path) -> None:
    config = load()
    write_snapshot(config, tmp_path / "snap.json")
    assert read_snapshot(tmp_path / "snap.json") == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"htp": {}}, "htp: unknown key"),
        ({"http": {"port": "80"}}, "http.port: expected an integer >= 0"),
        ({"http": {"port": 70000}}, "http.port: expected a port 0..65535"),
        ({"http": {"read_timeout_s": 0}}, "http.read_timeout_s: expected a number of seconds > 0"),
        ({"http": {"keepalive_s": 2.5}}, "http.keepalive_s: expected an integer"),
        ({"models": [{"name": "a"}]}, "models[0].class: missing"),
        ({"models": [{"name": "a b", "class": "m:C"}]}, "models[0].name"),
        ({"models": [{"name": "a", "class": "m:C", "instances": 0}]}, "instances: expected"),
        ({"models": [{"name": "a", "class": "m:C"}] * 2}, "appears more than once"),
        (
            {"models": [{"name": "a", "class": "m:C", "device": "gpu"}]},
            'models[0].device: expected "cpu", "cuda" or "cuda:N"',
        ),
        ({"server": {"default_model": "zz"}}, "server.default_model: names model 'zz'"),
        ({"server": {"log_level": "loud"}}, "server.log_level"),
        ({"mip": {"listeners": "8002"}}, "mip.listeners: expected an array of {port, model}"),
        ({"mip": {"listeners": [{"port": 1, "model": "zz"}]}}, "mip.listeners[0].model"),
    ],
)
def test_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_dict(data, "my.toml")


def test_no_mip_listeners_means_no_mip_process_and_a_metrics_port_may_be_set() -> None:
    config = from_dict({"mip": {"listeners": []}, "http": {"metrics_port": 0}}, "my.toml")
    assert (config.mip.workers, config.mip.listeners) == (0, ())
    assert config.http.metrics_port == 0
    assert from_dict({}, "my.toml").http.metrics_port is None


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)
