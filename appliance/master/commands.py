"""The commands of ``appliance ctl``: what each needs of the master, and the binding.

The handlers see the master through :class:`Controls` alone, so they cannot
reach into its children, slots or timers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from appliance.master.control import Handler


class Controls(Protocol):
    """What the control socket may ask of the master."""

    def report(self) -> dict[str, Any]:
        """Every process with its state, restarts, RSS and CPU; online, ready."""
        ...

    def set_online(self, online: bool) -> None: ...

    def begin_drain(self, reason: str) -> None: ...

    def reload(self) -> dict[str, Any]: ...

    def load_model(
        self, model: str, overrides: dict[str, Any] | None = None, directory: str | None = None
    ) -> dict[str, Any]: ...

    def unload(self, model: str) -> dict[str, Any]: ...


def handlers(master: Controls) -> dict[str, Handler]:
    """Bind every command to ``master``."""
    return {
        "status": lambda _request: master.report(),
        "online": lambda _request: _set_online(master, True),
        "offline": lambda _request: _set_online(master, False),
        "stop": lambda _request: _stop(master),
        # Read the config again; changed models are swapped in once ready.
        "reload": lambda _request: master.reload(),
        "load": lambda request: master.load_model(
            _model(request), _overrides(request), _directory(request)
        ),
        "unload": lambda request: master.unload(_model(request)),
    }


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


def _directory(request: dict[str, Any]) -> str | None:
    """The model directory a frontend wrote a model shipped inline into, if any."""
    directory = request.get("directory")
    if directory is not None and (not isinstance(directory, str) or not directory):
        raise ValueError('"directory" must be the path of a model directory')
    return directory


def _set_online(master: Controls, online: bool) -> dict[str, Any]:
    master.set_online(online)
    return {"online": online}


def _stop(master: Controls) -> dict[str, Any]:
    """Drain and stop, as SIGTERM does."""
    master.begin_drain("ctl stop")
    return {"draining": True}
