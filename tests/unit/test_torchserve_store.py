"""A TorchServe model store read as entries, and torchserve's command line and
config.properties read as the config they mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.formats import command_line
from appliance.formats.torchserve import properties, store
from tests.torchserve_models import BATCH_CONFIG, ECHO_HANDLER, write_mar, write_model_dir


@pytest.fixture
def model_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    write_mar(root, "echo", ECHO_HANDLER, version="2.0")
    write_mar(root, "batch", ECHO_HANDLER, config_yaml=BATCH_CONFIG + "minWorkers: 2\n")
    write_model_dir(root, "unpacked", ECHO_HANDLER)
    return root


def test_all_serves_every_archive_with_what_its_model_config_says(model_store: Path) -> None:
    entries = {entry["name"]: entry for entry in store.scan(model_store, ["all"])}
    assert sorted(entries) == ["batch", "echo", "unpacked"]
    batch = entries["batch"]
    assert (batch["instances"], batch["max_batch_size"], batch["max_queue_delay_ms"]) == (2, 4, 200)
    assert batch["max_busy_s"] == 120
    assert entries["echo"]["options"]["version"] == "2.0"
    assert not any(entry["options"].get(store.UNREGISTERED) for entry in entries.values())


def test_models_named_serve_and_the_others_wait_to_be_registered(model_store: Path) -> None:
    entries = {entry["name"]: entry for entry in store.scan(model_store, ["first=echo.mar"])}
    assert entries["first"]["options"]["path"].endswith("echo.mar")
    assert not entries["first"]["options"].get(store.UNREGISTERED)
    # The store's other archives, named by their manifests, are known but not served.
    assert entries["batch"]["options"][store.UNREGISTERED] is True
    assert entries["unpacked"]["options"][store.UNREGISTERED] is True
    assert "echo" not in entries


def test_an_archive_that_cannot_be_read_is_served_broken_with_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "bad.mar").write_bytes(b"not a zip")
    [entry] = store.scan(root, ["all", "missing.mar"])[:1]
    assert entry["class"] == store.BROKEN_CLASS
    assert "not a model archive" in entry["options"]["reason"]
    missing = store.scan(root, ["missing.mar"])[0]
    assert "no such archive" in missing["options"]["reason"]


def test_config_properties_reads_as_torchserve_s_flags(tmp_path: Path, model_store: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_text(
        "# TorchServe\n"
        "inference_address=http://127.0.0.1:18080\n"
        "management_address = http://127.0.0.1:18081\n"
        "metrics_address: http://127.0.0.1:18082\n"
        "grpc_inference_port=17070\n"
        f"model_store={model_store}\n"
        "load_models=echo.mar,\\\n"
        "    batch.mar\n"
        "max_request_size=1048576\n"
        "number_of_netty_threads=4\n"
    )
    notes: list[str] = []
    config = command_line.config(["--ts-config", str(path), "--http-port=19000"], notes)
    # A flag on the command line wins over the file.
    assert (config["http"]["port"], config["http"]["management_port"]) == (19000, 18081)
    assert (config["http"]["metrics_port"], config["grpc"]["port"]) == (18082, 17070)
    assert config["http"]["max_body_bytes"] == 1048576
    assert config["server"]["host"] == "127.0.0.1"
    assert config["repositories"] == [
        {"path": str(model_store), "models": ["echo.mar", "batch.mar"]}
    ]
    assert notes == [f"--ts-config {path}: number_of_netty_threads is not used by the appliance"]


@pytest.mark.parametrize(
    ("line", "wanted"),
    [
        ('models={"noop": {"1.0": {"minWorkers": 1}}}', "models is not taken"),
        ("install_py_dep_per_model=true", "install_py_dep_per_model is not taken"),
        ("some_new_key=1", "some_new_key is not a config.properties key"),
        ("inference_address=8080", "expected http://HOST:PORT"),
    ],
)
def test_config_properties_refuses_what_it_cannot_take_by_name(
    tmp_path: Path, line: str, wanted: str
) -> None:
    path = tmp_path / "config.properties"
    path.write_text(line + "\n")
    with pytest.raises(properties.PropertiesError, match=wanted):
        properties.as_flags(properties.read(path), path)


def test_a_model_store_listens_on_torchserve_s_ports(model_store: Path) -> None:
    config = command_line.config(["--model-store", str(model_store), "--models", "all", "--ncs"])
    assert (config["http"]["port"], config["grpc"]["port"]) == (8080, 7070)
    assert (config["http"]["metrics_port"], config["http"]["management_port"]) == (8082, 8081)
    assert config["grpc"]["management_port"] == 7071
    # Token authorization is on, as TorchServe's, unless disabled.
    assert command_line.TOKEN_AUTH in config
    disabled = ["--model-store", str(model_store), "--disable-token-auth"]
    assert command_line.TOKEN_AUTH not in command_line.config(disabled)
    assert config["repositories"] == [{"path": str(model_store), "models": ["all"]}]
