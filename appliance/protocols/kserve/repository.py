"""The model repository extension: index, load and unload, for both transports.

SPEC: PROTOCOL-FACTS §2.5. The index lists every model the appliance knows:
those it serves (READY, or UNAVAILABLE with the reason, such as the error a
broken model file gave), then those configured or found in a model
repository but not served now (UNAVAILABLE, "unloaded"). Load and unload
drive the master (``ModelClient.load_model``/``unload_model``): a load reads
the config file and the repositories again (with the request's override
config, if any, on top: override.py), so a new version dropped into a
repository is served once its instances are ready; a load that ships the
model's files (``file:`` parameters) serves the model from them
(appliance/client/inline.py); an unload stops routing
to the model and retires its workers. Errors say "failed to load" as
tritonclient's model_control examples expect.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from appliance.client import inline, override
from appliance.client.api import ModelClient
from appliance.errors import BadRequest, ControlError, ModelNotFound, ModelNotReady
from appliance.protocols.kserve.errors import PollFailed
from appliance.protocols.kserve.service import version_of

# Loading imports the model and its runtime (torch alone takes seconds).
LOAD_TIMEOUT_S = 300.0
UNLOADED = "unloaded"


def index(client: ModelClient, ready_only: bool) -> list[dict[str, Any]]:
    """Return the index entries, by name as Triton lists them: served models and the
    configured or repository ones not served now."""
    served = client.models()
    known = client.known_models()
    entries: list[dict[str, Any]] = []
    for model in served:
        # A model that failed to load has no metadata; its files still say its version.
        entry = {"name": model, "version": version_of(client, model) or known.get(model, "")}
        if client.model_ready(model):
            entry["state"] = "READY"  # no reason, as Triton lists a ready model
        else:
            entry.update(state="UNAVAILABLE", reason=client.why_not_ready(model))
        entries.append(entry)
    for model in sorted(set(known) - set(served)):
        entries.append(
            {"name": model, "version": known[model], "state": "UNAVAILABLE", "reason": UNLOADED}
        )
    if ready_only:
        entries = [entry for entry in entries if entry["state"] == "READY"]
    # By name: config order would move a model to the end each time it is reloaded.
    entries.sort(key=lambda entry: entry["name"])
    return entries


def load(client: ModelClient, model: str, parameters: Mapping[str, Any]) -> None:
    """(Re)load ``model`` from the config and repositories; return once it serves.

    A ``config`` parameter (Triton's model-config JSON) overrides the keys
    override.py understands for this load; without one the model's own
    config applies again. ``file:<path>`` parameters ship the model's own
    files (bytes over gRPC, base64 over REST; ``config`` is then required):
    it is served from them, in place of any configured model of that name,
    until a load without files or an unload.

    Raises:
        BadRequest: the override config is malformed or sets what cannot be
            applied; a file path no model directory could hold ("Invalid file
            path"); files without a config, or content that is not bytes/base64.
        ModelNotFound: no such model is configured or in a repository.
        ModelNotReady: it did not become ready; the message says why.
    """
    files = _files(model, parameters)
    if files and "config" not in parameters:
        raise BadRequest(
            f"failed to load '{model}': model files (file: parameters) need the model's "
            "config in the same request (the config parameter)"
        )
    overrides = override.parse(model, parameters["config"], files) if "config" in parameters else {}
    known = client.known_models()
    if not files and model not in known and model not in client.models():
        raise ModelNotFound(
            f"failed to load '{model}': no model of that name is configured or in a model "
            "repository"
        )
    try:
        client.load_model(model, LOAD_TIMEOUT_S, overrides, files)
    except ControlError as ex:
        raise ModelNotReady(_refused("load", model, ex)) from None
    wanted = "" if files else known.get(model, "")
    serving = version_of(client, model)
    if wanted and serving != wanted:
        # The master keeps the old instances when the new ones fail to load.
        raise ModelNotReady(
            f"failed to load '{model}' version {wanted}: its instances did not become ready, "
            f"so version {serving} still serves (`appliance ctl status` and the log say why)"
        )


def _files(model: str, parameters: Mapping[str, Any]) -> dict[str, bytes]:
    """The ``file:`` parameters as path -> content, every path checked first.

    Raises:
        BadRequest: a path no model directory could hold (Triton's "Invalid
            file path", and its "failed to poll from model repository"), or a
            content that is neither bytes nor base64 text.
        PollFailed: a path component too long for the file system, which
            Triton reports as an internal error.
    """
    paths = {key: key.removeprefix("file:") for key in parameters if key.startswith("file:")}
    for path in paths.values():
        problem = inline.path_problem(path)
        if problem:
            refused = PollFailed if problem == inline.TOO_LONG else BadRequest
            raise refused(
                f"failed to load '{model}': failed to poll from model repository: "
                f"Invalid file path {inline.shown(path)}: {problem}"
            )
    files = {}
    for key, path in paths.items():
        content = parameters[key]
        if isinstance(content, str):
            try:
                content = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise BadRequest(
                    f"failed to load '{model}': the content of {inline.shown(key)} is not base64"
                ) from None
        if not isinstance(content, bytes):
            raise BadRequest(
                f"failed to load '{model}': the content of {inline.shown(key)} must be bytes "
                "(gRPC) or a base64 string (REST)"
            )
        files[path] = content
    return files


def unload(client: ModelClient, model: str) -> None:
    """Stop serving ``model``; a known model that is not served is left as it is.

    Raises:
        ModelNotFound: no such model is configured or in a repository.
        ModelNotReady: the master cannot unload now (a reload is running).
    """
    if model not in client.models():
        if model in client.known_models():
            return
        raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
    try:
        client.unload_model(model)
    except ControlError as ex:
        raise ModelNotReady(_refused("unload", model, ex)) from None


def _refused(action: str, model: str, error: ControlError) -> str:
    """Word the master's refusal (a reload running, say) as tritonclient expects."""
    text = str(error).removeprefix(f"failed to {action}: ")
    return f"failed to {action} '{model}': {text}"
