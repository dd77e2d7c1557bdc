"""The control plane as the client API offers it: load, unload, online/offline, status.

These go to the master's control socket (appliance.processes.control); protocols reach
them through :class:`~appliance.client.api.ModelClient`, never the socket.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from appliance.client import inline
from appliance.client.routing import Router
from appliance.core.tree import Tree
from appliance.errors import ControlError, ModelNotReady, error_from_code
from appliance.processes.control import request

LOAD_POLL_S = 0.05


def set_online(tree: Tree, online: bool) -> None:
    """Ask the master to turn the host's readiness on or off, for all protocols.

    Raises:
        ControlError: the master cannot be reached.
    """
    request(tree.control_path, "online" if online else "offline")


def master_status(tree: Tree, timeout_s: float) -> dict[str, Any] | None:
    """Return the master's status (every process with restarts, RSS and CPU;
    reload state; sizing), or None when it does not answer within ``timeout_s``:
    a page or a scrape shows the status table's view instead of hanging."""
    try:
        return request(tree.control_path, "status", timeout_s=timeout_s)
    except (ControlError, OSError):
        return None


def load_model(
    tree: Tree,
    router: Router,
    model: str,
    timeout_s: float = 300.0,
    overrides: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
) -> None:
    """Have the master (re)load ``model`` from its config; return once it serves.

    ``overrides`` replaces ``[[models]]`` keys (``max_batch_size``,
    ``instances``, ``max_queue_delay_ms``) for this load only; a later
    load without them serves the config's own entry again.

    ``files`` (path in the model directory -> content, such as
    ``{"1/model.onnx": ...}``) ships the model itself: it is served from
    those files in place of any configured model of that name, until a load
    without files or an unload (see inline.py).

    Raises:
        BadRequest: a file path no model directory could hold; nothing was written.
        ControlError: the master refused (unknown model or key, unservable
            files, a reload running).
        ModelNotReady: its new instances failed to load, or took too long;
            Overloaded (ShmExhausted's code): /dev/shm had no room for them.
    """
    if files:
        directory = inline.write(tree, model, files)
        try:
            request(
                tree.control_path,
                "load",
                model=model,
                overrides=dict(overrides or {}),
                directory=str(directory),
            )
        except BaseException:
            inline.remove(directory)  # the master did not take it
            raise
    else:
        request(tree.control_path, "load", model=model, overrides=dict(overrides or {}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = request(tree.control_path, "status")
        if state["reloading"] is None:
            ensemble = next((e for e in state.get("ensembles", ()) if e["name"] == model), None)
            if ensemble is not None:
                # No instance of its own: it serves once every step's model does.
                if ensemble["ready"]:
                    return
                raise ModelNotReady(f"failed to load ensemble {model}: {ensemble['not_ready']}")
            if model in router.slots and router.ready(model):
                return
            failed = state.get("failed_loads", {}).get(model)
            if failed is not None:
                raise error_from_code(
                    failed["code"], f"failed to load model {model}: {failed['reason']}"
                )
            raise ModelNotReady(f"failed to load model {model}: {router.why_not_ready(model)}")
        time.sleep(LOAD_POLL_S)
    raise ModelNotReady(f"failed to load model {model}: not ready after {timeout_s:.0f} s")


def unload_model(tree: Tree, model: str) -> None:
    """Have the master stop serving ``model``; its workers finish what they hold.

    Raises:
        ControlError: the model is not loaded, or a reload is running.
    """
    request(tree.control_path, "unload", model=model)
