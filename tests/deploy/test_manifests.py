"""deploy/'s manifests fit the Kubernetes and KServe schemas, and agree with each other."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from appliance.config import reader as config_reader
from appliance.master import shm
from tests.deploy.manifests import DEPLOY, ROOT, containerfile, documents, manifests, validate


def by_kind(kind: str) -> dict[str, Any]:
    found = [doc for path in manifests() for doc in documents(path) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/, found {len(found)}"
    return found[0]


def pod_container() -> dict[str, Any]:
    return dict(by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0])


def runtime_container() -> dict[str, Any]:
    return dict(by_kind("ClusterServingRuntime")["spec"]["containers"][0])


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_fits_its_schema(path: Any) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_the_schemas_catch_mistakes() -> None:
    deployment = copy.deepcopy(by_kind("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    runtime = copy.deepcopy(by_kind("ClusterServingRuntime"))
    runtime["spec"]["protocolVersions"].append("v3")
    with pytest.raises(jsonschema.ValidationError):
        validate(runtime)
    runtime = copy.deepcopy(by_kind("ClusterServingRuntime"))
    runtime["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 8080
    with pytest.raises(jsonschema.ValidationError):
        validate(runtime)
    service = copy.deepcopy(by_kind("InferenceService"))
    del service["spec"]["predictor"]["model"]["modelFormat"]
    with pytest.raises(jsonschema.ValidationError):
        validate(service)


def test_the_runtime_serves_the_inference_service_over_v2() -> None:
    runtime = by_kind("ClusterServingRuntime")
    model = by_kind("InferenceService")["spec"]["predictor"]["model"]
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert {"onnx", "pytorch"} <= formats
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


def test_pods_probe_the_appliance_and_outlast_the_drain() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    for container in (pod_container(), runtime_container()):
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "model loading"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "/dev/shm" in mounts
    shm = {v["name"]: v for v in pod["volumes"]}[mounts["/dev/shm"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"]

    # preStop (balancer wait + drain), then SIGTERM's own drain, within the grace period.
    command = pod_container()["lifecycle"]["preStop"]["exec"]["command"]
    settings = dict(word.split("=", 1) for word in command if "=" in word)
    config_path = containerfile().source(command[-1])
    server = tomllib.loads(config_path.read_text())["server"]
    drain_s = float(settings["BALANCER_WAIT_S"]) + float(settings["DRAIN_TIMEOUT_S"])
    stop_s = server["grace_s"] + server["drain_timeout_s"] + server["stop_timeout_s"]
    assert pod["terminationGracePeriodSeconds"] > drain_s + stop_s


def test_the_image_runs_as_the_pods_user_on_the_ports_they_probe() -> None:
    image = containerfile()
    assert image.user.isdigit()
    assert int(image.user) != 0
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(image.user)
    assert pod_container()["command"] == image.cmd
    for container in (pod_container(), runtime_container()):
        argv = container.get("command") or container["args"]
        config = tomllib.loads(image.source(argv[argv.index("--config") + 1]).read_text())
        assert config["server"]["host"] == "0.0.0.0"
        ports = {config["http"]["port"], config["grpc"]["port"]}
        ports |= {listener["port"] for listener in config["mip"]["listeners"]}
        assert ports <= set(image.exposed)
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        probe_port = container["readinessProbe"]["httpGet"]["port"]
        assert named.get(probe_port, probe_port) == config["http"]["port"]
        assert container["lifecycle"]["preStop"]["exec"]["command"][-1] == argv[-1]
    # KServe sends v2 gRPC to the port named h2c.
    kserve = tomllib.loads(image.source("/etc/appliance/kserve.toml").read_text())
    named = {p["name"]: p["containerPort"] for p in runtime_container()["ports"]}
    assert named["h2c"] == kserve["grpc"]["port"]


def test_the_kserve_config_serves_the_repository_kserve_downloads(tmp_path: Any) -> None:
    image = containerfile()
    text = image.source("/etc/appliance/kserve.toml").read_text()
    assert 'path = "/mnt/models"' in text
    # /mnt/models as KServe's storage initializer leaves it: the storageUri's contents.
    repository = ROOT / "appliance" / "demos" / "repository"
    config_path = tmp_path / "kserve.toml"
    config_path.write_text(text.replace('"/mnt/models"', f'"{repository}"'))
    config = config_reader.load(config_path)
    assert {"digits_onnx", "digits_torch"} <= {model.name for model in config.models}
    assert config.server.host == "0.0.0.0"


def _quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


@pytest.mark.parametrize("kind", ["Deployment", "ClusterServingRuntime"])
def test_dev_shm_holds_what_the_config_needs_at_the_pods_cpu_limit(
    kind: str, tmp_path: Any
) -> None:
    """What `appliance shm-size --config <its config> --cpus <its limit>` asks for, at least."""
    if kind == "Deployment":
        spec, container = by_kind(kind)["spec"]["template"]["spec"], pod_container()
    else:
        spec, container = by_kind(kind)["spec"], runtime_container()
    argv = container.get("command") or container["args"]
    text = containerfile().source(argv[argv.index("--config") + 1]).read_text()
    # KServe's /mnt/models: one model, as an InferenceService serves.
    repository = ROOT / "appliance" / "demos" / "repository"
    data = tomllib.loads(text.replace('"/mnt/models"', f'"{repository}"'))
    data["server"]["cpus"] = int(container["resources"]["limits"]["cpu"])
    config = config_reader.from_dict(data, str(tmp_path / "config.toml"), scan_repositories=True)
    if kind != "Deployment":
        config = dataclasses.replace(config, models=config.models[:1])
    wanted = sum(kind.total for kind in shm.needs(config))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = {v["name"]: v for v in spec["volumes"]}[mounts["/dev/shm"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    assert _quantity(volume["emptyDir"]["sizeLimit"]) >= shm.recommended_bytes(wanted)
