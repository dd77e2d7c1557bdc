"""TorchServe's management API: list, describe, register, scale, unregister, set-default.

SPEC: TorchServe 0.12's ManagementRequestHandler and ApiUtils::

    GET    /models[?limit=N&next_page_token=T]   {"models": [...], "nextPageToken"?}
    GET    /models/{m}[/{v}|/all]                 [{"modelName", ..., "workers": [...]}]
    POST   /models?url=F.mar[&model_name=&initial_workers=&batch_size=&max_batch_delay=
                   &response_timeout=&synchronous=]
    PUT    /models/{m}[/{v}]?min_worker=N[&max_worker=&synchronous=]
    DELETE /models/{m}[/{v}]
    PUT    /models/{m}/{v}/set-default

The appliance's models are the model store's archives (formats/torchserve):
registering one serves it (a load through the client API, with its workers
as instances and its batch settings), scaling loads it again with another
number of instances (0 unloads it), unregistering unloads it. An archive
registers from the model store only (a ``url`` naming a file there; no
downloads), under the name it was found by. Answers and errors are
TorchServe's words; ``synchronous=false`` is answered 202 at once while the
change runs on.
"""

from __future__ import annotations

import datetime
import logging
import threading
from pathlib import Path
from typing import Any

import falcon
import psutil

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError, ControlError, ModelNotReady
from appliance.protocols.torchserve.answers import guarded_json, json_answer
from appliance.protocols.torchserve.errors import (
    TorchServeError,
    model_not_found,
    pretty,
    version_not_found,
)
from appliance.protocols.web import App

log = logging.getLogger("appliance.torchserve")
DEFAULT_LIMIT = 100
DEFAULT_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 300.0
# Worker ids as TorchServe numbers them: from 9000, one per worker.
FIRST_WORKER_ID = 9000


def _int(req: falcon.Request, name: str, default: int) -> int:
    value = req.get_param(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise TorchServeError(
            400, "BadRequestException", f"{name}: not a number: {value}"
        ) from None


def _bool(req: falcon.Request, name: str, default: bool) -> bool:
    value = req.get_param(name)
    return default if value is None else value.lower() == "true"


class Models:
    """``/models``: the list (GET) and registration (POST)."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        limit = _int(req, "limit", DEFAULT_LIMIT)
        limit = limit if 0 < limit <= DEFAULT_LIMIT else DEFAULT_LIMIT
        start = max(0, _int(req, "next_page_token", 0))
        names = sorted(self.client.models())
        page = names[start : start + limit]
        found: dict[str, Any] = {}
        if start + limit < len(names):
            found["nextPageToken"] = str(start + limit)
        urls = _urls(self.client)
        found["models"] = [{"modelName": name, "modelUrl": urls.get(name, "")} for name in page]
        json_answer(resp, pretty(found))

    @guarded_json
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        url = req.get_param("url")
        if not url:
            raise TorchServeError(400, "BadRequestException", "Parameter url is required.")
        entry = self._archive(url, req.get_param("model_name"))
        name, version = entry["name"], str(entry["options"].get("version", ""))
        if name in self.client.models():
            raise TorchServeError(
                409,
                "ConflictStatusException",
                f"Model version {version} is already registered for model {name}",
            )
        workers = _int(req, "initial_workers", 0) or int(entry.get("instances", 0))
        if workers <= 0:
            message = (
                f'Model "{name}" Version: {version} registered with 0 initial workers. '
                "Use scale workers API to add workers for the model."
            )
            json_answer(resp, pretty({"status": message}))
            return
        overrides = {"instances": workers}
        batch = _int(req, "batch_size", 0)
        if batch > 1:
            overrides["max_batch_size"] = batch
            overrides["max_queue_delay_ms"] = _int(req, "max_batch_delay", DEFAULT_BATCH_DELAY_MS)
        done = f'Model "{name}" Version: {version} registered with {workers} initial workers'
        _change(resp, req, lambda: self._load(name, overrides), done, True)

    def _archive(self, url: str, name: str | None) -> dict[str, Any]:
        """The store's archive ``url`` names, as the repository scan found it."""
        if "://" in url:
            raise TorchServeError(
                400,
                "BadRequestException",
                f"{url}: the appliance registers archives of its model store only (no downloads)",
            )
        file = Path(url).name
        for entry in self.client.repository_entries():
            path = str(entry.get("options", {}).get("path", ""))
            if Path(path).name == file and "reason" not in entry.get("options", {}):
                if name and name != entry["name"]:
                    raise TorchServeError(
                        400,
                        "BadRequestException",
                        f"{file} is served as {entry['name']}; to serve it as {name}, "
                        f"start with --models {name}={file}",
                    )
                return entry
        raise TorchServeError(
            404, "ModelNotFoundException", f"Model not found in model store: {url}"
        )

    def _load(self, name: str, overrides: dict[str, Any]) -> None:
        self.client.load_model(name, LOAD_TIMEOUT_S, overrides)


class Model:
    """``/models/{m}[/{v}]``: describe (GET), scale (PUT), unregister (DELETE)."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_get(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        served = self._version(model, None if version == "all" else version)
        json_answer(resp, pretty([_describe(self.client, model, served)]))

    @guarded_json
    def on_put(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        served = self._version(model, version)
        workers = _int(req, "min_worker", 1)
        if _int(req, "max_worker", workers) < workers:
            raise TorchServeError(
                400, "BadRequestException", "max_worker cannot be less than min_worker."
            )
        done = f"Workers scaled to {workers} for model: {model}"
        if version is not None:
            done += f", version: {served}"
        if workers <= 0:
            _change(resp, req, lambda: self.client.unload_model(model), done, False)
            return
        overrides = {"instances": workers}
        _change(
            resp,
            req,
            lambda: self.client.load_model(model, LOAD_TIMEOUT_S, overrides),
            done,
            False,
        )

    @guarded_json
    def on_delete(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        self._version(model, version)
        self.client.unload_model(model)
        json_answer(resp, pretty({"status": f'Model "{model}" unregistered'}))

    def _version(self, model: str, version: str | None) -> str:
        """The version a registered model serves; ``version`` must be it, when named."""
        if model not in self.client.models():
            raise model_not_found(model)
        served = self.client.known_models().get(model, "")
        if version is not None and version != served:
            raise version_not_found(model, version)
        return served


class SetDefault:
    """``/models/{m}/{v}/set-default``: a model serves one version, its default."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_put(self, _req: falcon.Request, resp: falcon.Response, model: str, version: str) -> None:
        Model(self.client)._version(model, version)
        message = f'Default version successfully updated for model "{model}" to "{version}"'
        json_answer(resp, pretty({"status": message}))


def _change(
    resp: falcon.Response, req: falcon.Request, run: Any, done: str, default_sync: bool
) -> None:
    """Run a load or unload: wait for it and answer ``done`` (synchronous), or answer
    202 at once and let it run on (a failure is then logged)."""
    if not _bool(req, "synchronous", default_sync):

        def background() -> None:
            try:
                run()
            except (ApplianceError, ControlError) as ex:
                log.warning("worker update failed: %s", ex)

        threading.Thread(target=background, name="torchserve-management", daemon=True).start()
        json_answer(resp, pretty({"status": "Processing worker updates..."}), 202)
        return
    try:
        run()
    except ControlError as ex:
        raise TorchServeError(500, "InternalServerException", str(ex)) from None
    except ModelNotReady as ex:
        raise TorchServeError(500, "InternalServerException", ex.message) from None
    json_answer(resp, pretty({"status": done}))


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
    batch = int(entry.get("max_batch_size") or 1)
    return {
        "modelName": model,
        "modelVersion": version,
        "modelUrl": Path(str(entry.get("options", {}).get("path", ""))).name,
        "runtime": "python",
        "minWorkers": len(workers),
        "maxWorkers": len(workers),
        "batchSize": batch,
        "maxBatchDelay": int(entry.get("max_queue_delay_ms", DEFAULT_BATCH_DELAY_MS)),
        "responseTimeout": int(entry.get("max_busy_s", DEFAULT_RESPONSE_TIMEOUT_S)),
        "loadedAtStartup": not entry.get("options", {}).get("unregistered", False),
        "workers": workers,
        "jobQueueStatus": {"remainingCapacity": 1024, "pendingRequests": 0},
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


def is_management(path: str) -> bool:
    """A path of the management API (the one its port answers)."""
    return path == "/models" or path.startswith("/models/")


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the management API (its port answers these alone: :func:`is_management`)."""
    app.add_route("/models", Models(client))
    model = Model(client)
    app.add_route("/models/{model}", model)
    app.add_route("/models/{model}/{version}", model)
    app.add_route("/models/{model}/{version}/set-default", SetDefault(client))
