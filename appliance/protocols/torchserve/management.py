"""TorchServe's management operations, for its REST and gRPC APIs alike.

SPEC: TorchServe 0.12's ManagementRequestHandler and ApiUtils. Each
operation takes the call's parameters (REST's query, gRPC's request
fields, by TorchServe's names) and answers ``(status, JSON value)``, or
raises a :class:`TorchServeError`:

    list         limit, next_page_token            {"models": [...], "nextPageToken"?}
    describe     model, version ("all" or one)     [{"modelName", ..., "workers": [...]}]
    register     url, model_name, initial_workers, batch_size, max_batch_delay, synchronous
    scale        model, version, min_worker, max_worker, synchronous
    unregister   model, version
    set_default  model, version

The appliance's models are the model store's archives (formats/torchserve):
registering one serves it (a load through the client API, its workers as
instances, its batch settings as overrides), scaling loads it again with
another number of instances (0 unloads it), unregistering unloads it. An
archive registers from the model store only (``url`` names a file there; no
downloads), under the name it was found by. ``synchronous=false`` answers
202 at once while the change runs on.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError, ControlError, ModelNotReady
from appliance.protocols.torchserve.errors import (
    TorchServeError,
    model_not_found,
    version_not_found,
)

log = logging.getLogger("appliance.torchserve")
Answer = tuple[int, Any]
Params = Mapping[str, Any]
DEFAULT_LIMIT = 100
DEFAULT_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 300.0
# Worker ids as TorchServe numbers them: from 9000, one per worker.
FIRST_WORKER_ID = 9000
# TorchServe's job_queue_size, which its describe reports as remaining capacity.
JOB_QUEUE_SIZE = 100
UNUSED_FIELDS = {
    "startupTimeout": 120,
    "maxRetryTimeoutInSec": 300,
    "clientTimeoutInMills": 0,
    "parallelType": "",
    "parallelLevel": 0,
}
SEQUENCE_FIELDS = {
    "continuousBatching": False,
    "useJobTicket": False,
    "useVenv": False,
    "stateful": False,
    "sequenceMaxIdleMSec": 0,
    "sequenceTimeoutMSec": 0,
    "maxNumSequence": 0,
    "maxSequenceJobQueueSize": 0,
}


def number(params: Params, name: str, default: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TorchServeError(
            400, "BadRequestException", f"{name}: not a number: {value}"
        ) from None


def flag(params: Params, name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None or value == "":
        return default
    return value if isinstance(value, bool) else str(value).lower() == "true"


def list_models(client: ModelClient, params: Params) -> Answer:
    limit = number(params, "limit", DEFAULT_LIMIT)
    limit = limit if 0 < limit <= DEFAULT_LIMIT else DEFAULT_LIMIT
    start = max(0, number(params, "next_page_token", 0))
    names = sorted(client.models())
    page = names[start : start + limit]
    found: dict[str, Any] = {}
    if start + limit < len(names):
        found["nextPageToken"] = str(start + limit)
    urls = _urls(client)
    found["models"] = [{"modelName": name, "modelUrl": urls.get(name, "")} for name in page]
    return 200, found


def describe(client: ModelClient, model: str, version: str | None) -> Answer:
    served = _version(client, model, None if version == "all" else version)
    return 200, [_describe(client, model, served)]


def register(client: ModelClient, params: Params) -> Answer:
    url = str(params.get("url") or "")
    if not url:
        raise TorchServeError(400, "BadRequestException", "Parameter url is required.")
    entry = _archive(client, url, params.get("model_name") or None)
    name, version = entry["name"], str(entry["options"].get("version", ""))
    if name in client.models():
        raise TorchServeError(
            409,
            "ConflictStatusException",
            f"Model version {version} is already registered for model {name}",
        )
    workers = number(params, "initial_workers", 0) or int(entry.get("instances", 0))
    if workers <= 0:
        message = (
            f'Model "{name}" Version: {version} registered with 0 initial workers. '
            "Use scale workers API to add workers for the model."
        )
        return 200, {"status": message}
    overrides: dict[str, Any] = {"instances": workers}
    batch = number(params, "batch_size", 0)
    if batch > 1:
        overrides["max_batch_size"] = batch
        overrides["max_queue_delay_ms"] = number(params, "max_batch_delay", DEFAULT_BATCH_DELAY_MS)
    done = f'Model "{name}" Version: {version} registered with {workers} initial workers'
    load = lambda: client.load_model(name, LOAD_TIMEOUT_S, overrides)  # noqa: E731
    return _change(load, done, flag(params, "synchronous", True))


def scale(client: ModelClient, model: str, version: str | None, params: Params) -> Answer:
    served = _version(client, model, version)
    workers = number(params, "min_worker", 1)
    if number(params, "max_worker", workers) < workers:
        raise TorchServeError(
            400, "BadRequestException", "max_worker cannot be less than min_worker."
        )
    done = f"Workers scaled to {workers} for model: {model}"
    if version is not None:
        done += f", version: {served}"
    if workers <= 0:
        run: Callable[[], None] = lambda: client.unload_model(model)  # noqa: E731
    else:
        overrides = {"instances": workers}
        run = lambda: client.load_model(model, LOAD_TIMEOUT_S, overrides)  # noqa: E731
    return _change(run, done, flag(params, "synchronous", False))


def unregister(client: ModelClient, model: str, version: str | None) -> Answer:
    _version(client, model, version)
    client.unload_model(model)
    return 200, {"status": f'Model "{model}" unregistered'}


def set_default(client: ModelClient, model: str, version: str) -> Answer:
    if _version(client, model, None) != version:
        # Worded so by TorchServe's ModelManager (its other 404s say "version:").
        raise TorchServeError(
            404,
            "ModelVersionNotFoundException",
            f"Model version {version} does not exist for model {model}",
        )
    return 200, {
        "status": f'Default version successfully updated for model "{model}" to "{version}"'
    }


def _version(client: ModelClient, model: str, version: str | None) -> str:
    """The version a registered model serves; ``version`` must be it, when named."""
    if model not in client.models():
        raise model_not_found(model)
    served = client.known_models().get(model, "")
    if version is not None and version != served:
        raise version_not_found(model, version)
    return served


def _archive(client: ModelClient, url: str, name: str | None) -> dict[str, Any]:
    """The store's archive ``url`` names, as the repository scan finds it."""
    if "://" in url:
        raise TorchServeError(
            400,
            "BadRequestException",
            f"{url}: the appliance registers archives of its model store only (no downloads)",
        )
    file = Path(url).name
    for entry in client.repository_entries():
        options = entry.get("options", {})
        if Path(str(options.get("path", ""))).name != file or "reason" in options:
            continue
        if name and name != entry["name"]:
            raise TorchServeError(
                400,
                "BadRequestException",
                f"{file} is served as {entry['name']}; to serve it as {name}, "
                f"start with --models {name}={file}",
            )
        return entry
    raise TorchServeError(404, "ModelNotFoundException", f"Model not found at: {url}")


def _change(run: Callable[[], None], done: str, synchronous: bool) -> Answer:
    """Run a load or unload: wait for it and answer ``done``, or (not ``synchronous``)
    answer 202 at once and let it run on (a failure is then logged)."""
    if not synchronous:

        def background() -> None:
            try:
                run()
            except (ApplianceError, ControlError) as ex:
                log.warning("worker update failed: %s", ex)

        threading.Thread(target=background, name="torchserve-management", daemon=True).start()
        return 202, {"status": "Processing worker updates..."}
    try:
        run()
    except ControlError as ex:
        raise TorchServeError(500, "InternalServerException", str(ex)) from None
    except ModelNotReady as ex:
        raise TorchServeError(500, "InternalServerException", ex.message) from None
    return 200, {"status": done}


def _urls(client: ModelClient) -> dict[str, str]:
    """Each model's archive file name (modelUrl), for the models a store gives."""
    return {
        str(entry["name"]): Path(str(entry.get("options", {}).get("path", ""))).name
        for entry in client.repository_entries()
    }


def _describe(client: ModelClient, model: str, version: str) -> dict[str, Any]:
    """A registered model's description, in the fields TorchServe's describe gives."""
    entry = next((e for e in client.repository_entries() if e["name"] == model), {})
    status = client.master_status() or {}
    # The instances serving or starting (not those a load or a scale retires).
    processes = [
        p
        for p in status.get("processes", ())
        if p.get("model") == model and p.get("state") in ("ready", "starting")
    ]
    workers = [_worker(index, process) for index, process in enumerate(processes)]
    return {
        "modelName": model,
        "modelVersion": version,
        "modelUrl": Path(str(entry.get("options", {}).get("path", ""))).name,
        "runtime": "python",
        "minWorkers": len(workers),
        "maxWorkers": len(workers),
        "batchSize": int(entry.get("max_batch_size") or 1),
        "maxBatchDelay": int(entry.get("max_queue_delay_ms", DEFAULT_BATCH_DELAY_MS)),
        "responseTimeout": int(entry.get("max_busy_s", DEFAULT_RESPONSE_TIMEOUT_S)),
        # What TorchServe's describe has of features the appliance leaves at their defaults.
        **UNUSED_FIELDS,
        "deviceType": "gpu" if str(entry.get("device", "cpu")).startswith("cuda") else "cpu",
        **SEQUENCE_FIELDS,
        "loadedAtStartup": not entry.get("options", {}).get("unregistered", False),
        "workers": workers,
        "jobQueueStatus": {"remainingCapacity": JOB_QUEUE_SIZE, "pendingRequests": 0},
    }


def _worker(index: int, process: dict[str, Any]) -> dict[str, Any]:
    pid = int(process.get("pid") or 0)
    try:
        started = datetime.datetime.fromtimestamp(psutil.Process(pid).create_time(), datetime.UTC)
        start_time = started.strftime("%Y-%m-%dT%H:%M:%S.") + f"{started.microsecond // 1000:03d}Z"
    except (psutil.Error, ValueError):
        start_time = ""
    device = str(process.get("device") or "")
    return {
        "id": str(FIRST_WORKER_ID + index),
        "startTime": start_time,
        "status": "READY" if process.get("state") == "ready" else "UNLOADING",
        "memoryUsage": int(process.get("rss_bytes") or 0),
        "pid": pid,
        "gpu": device.startswith("cuda"),
        "gpuUsage": "N/A",
    }
