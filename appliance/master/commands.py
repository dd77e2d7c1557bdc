"""The commands of ``appliance ctl``, one function each (``cmd_<name>``)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from appliance import sizing
from appliance.config import ApplianceConfig
from appliance.core.status import Role

if TYPE_CHECKING:
    from appliance.master.control import Handler
    from appliance.master.supervisor import Supervisor


def handlers(supervisor: Supervisor) -> dict[str, Handler]:
    """Bind every command to ``supervisor``."""
    return {
        "status": lambda _request: cmd_status(supervisor),
        "online": lambda _request: cmd_online(supervisor, True),
        "offline": lambda _request: cmd_online(supervisor, False),
        "stop": lambda _request: cmd_stop(supervisor),
        "reload": lambda _request: cmd_reload(supervisor),
        "load": lambda request: supervisor.load_model(_model(request), _overrides(request)),
        "unload": lambda request: supervisor.unload(_model(request)),
    }


def cmd_status(supervisor: Supervisor) -> dict[str, Any]:
    """Every process with its state, restarts, RSS and CPU; online, ready."""
    status = supervisor.status
    supervisor.sample_stats()
    figures = supervisor.stats.figures
    processes: list[dict[str, Any]] = [
        {
            "pid": os.getpid(),
            "role": "master",
            "model": "",
            "state": "draining" if supervisor.drain.active else "running",
            "restarts": 0,
        }
    ]
    for child in supervisor.children:
        info = status.read(child.spec.slot)
        processes.append(
            {
                "pid": child.pid,
                "role": child.spec.title,
                "model": child.spec.model,
                "state": info.state.name.lower() if child.running else "stopped",
                "restarts": child.restarts,
                "generation": child.generation,
                "last_exit": child.last_exit,
                "note": info.note,
            }
        )
        if child.spec.model:
            processes[-1]["device"] = info.device or None
            processes[-1]["device_memory_bytes"] = info.device_memory if info.device else None
        if child.spec.status_role is Role.HTTP:
            for pid in supervisor.http_worker_pids():
                processes.append(
                    {
                        "pid": pid,
                        "role": "http worker",
                        "model": "",
                        "state": "ready",
                        "restarts": 0,
                    }
                )
    for process in processes:
        figure = figures.get(process["pid"] or -1)
        process["rss_bytes"] = figure.rss_bytes if figure else None
        process["cpu_percent"] = figure.cpu_percent if figure else None
    return {
        "tree": supervisor.tree.id,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - supervisor.started_at, 1),
        "requests_per_s": round(supervisor.requests_per_s(), 1),
        "in_flight": supervisor.in_flight(),
        "online": status.online,
        "ready": supervisor.ready,
        "draining": supervisor.drain.active,
        "reloading": supervisor.reloading.summary() if supervisor.reloading else None,
        "models": list(supervisor.layout),
        "unloaded": sorted(supervisor.unloaded),
        "ports": supervisor.ports,
        "processes": processes,
        "sizing": sizing_of(supervisor.config),
    }


def sizing_of(config: ApplianceConfig) -> dict[str, Any]:
    """How many processes of each kind the config asks for, and which were "auto"."""
    counts = {
        "http.workers": config.http.workers,
        "grpc.workers": config.grpc.workers,
        "mip.workers": config.mip.workers,
        **{f"models.{model.name}.instances": model.instances for model in config.models},
    }
    return {
        "cpus": config.server.cpus,
        "counts": counts,
        "auto": list(config.auto),
        "rule": sizing.rule_text(),
    }


def cmd_online(supervisor: Supervisor, online: bool) -> dict[str, Any]:
    supervisor.set_online(online)
    return {"online": online}


def cmd_reload(supervisor: Supervisor) -> dict[str, Any]:
    """Read the config again; changed models are swapped in once ready."""
    return supervisor.reload()


def _model(request: dict[str, Any]) -> str:
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError('this command needs "model": <name>')
    return model


def _overrides(request: dict[str, Any]) -> dict[str, Any]:
    overrides = request.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ValueError('"overrides" must be an object of [[models]] keys')
    return overrides


def cmd_stop(supervisor: Supervisor) -> dict[str, Any]:
    """Drain and stop, as SIGTERM does."""
    supervisor.drain.begin("ctl stop")
    return {"draining": True}
