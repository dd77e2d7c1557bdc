"""What ``appliance ctl status`` shows of each process, of each ensemble, and of the sizing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from appliance.config import sizing
from appliance.config.settings import ApplianceConfig, EnsembleConfig
from appliance.core.status import Role, SlotState, StatusTable
from appliance.master.children import Child
from appliance.master.stats import ProcessFigures


def process_rows(
    children: Iterable[Child],
    status: StatusTable,
    http_worker_pids: list[int],
    figures: Mapping[int, ProcessFigures],
    draining: bool,
) -> list[dict[str, Any]]:
    """One row per process: the master, each child, and gunicorn's HTTP workers."""
    rows: list[dict[str, Any]] = [
        {
            "pid": os.getpid(),
            "role": "master",
            "model": "",
            "state": "draining" if draining else "running",
            "restarts": 0,
        }
    ]
    for child in children:
        info = status.read(child.spec.slot)
        rows.append(
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
            rows[-1]["device"] = info.device or None
            rows[-1]["device_memory_bytes"] = info.device_memory if info.device else None
        if child.spec.status_role is Role.HTTP:
            rows += [
                {"pid": pid, "role": "http worker", "model": "", "state": "ready", "restarts": 0}
                for pid in http_worker_pids
            ]
    for row in rows:
        figure = figures.get(row["pid"] or -1)
        row["rss_bytes"] = figure.rss_bytes if figure else None
        row["cpu_percent"] = figure.cpu_percent if figure else None
    return rows


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


def ensemble_rows(
    ensembles: Iterable[EnsembleConfig], layout: Mapping[str, list[int]], status: StatusTable
) -> list[dict[str, Any]]:
    """One row per ensemble: its step models, and ready or the first step that is not.

    An ensemble has no process; it is ready when every step's model has a
    ready instance, as the frontends decide (client/ensemble.py).
    """
    rows = []
    for ensemble in ensembles:
        waiting = ""
        for index, step in enumerate(ensemble.steps):
            reason = _not_ready(step.model, layout, status)
            if reason:
                waiting = f"step {index} (model {step.model}) {reason}"
                break
        rows.append(
            {
                "name": ensemble.name,
                "steps": [step.model for step in ensemble.steps],
                "ready": not waiting,
                "not_ready": waiting or None,
            }
        )
    return rows


def _not_ready(model: str, layout: Mapping[str, list[int]], status: StatusTable) -> str:
    """Why a step's model serves nothing now; "" when one of its instances is ready."""
    slots = layout.get(model)
    if slots is None:
        return "is not loaded"
    infos = [status.read(slot) for slot in slots]
    if any(info.state is SlotState.READY for info in infos):
        return ""
    states = ", ".join(sorted({info.state.name.lower() for info in infos})) or "none"
    notes = sorted({info.note for info in infos if info.note})
    text = f"has no ready instance (0 of {len(slots)} ready; {states})"
    return f"{text}: {notes[0]}" if notes else text
