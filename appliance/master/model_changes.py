"""Loads, unloads and reloads: the served models as they change, and the reload under way.

Apart from the supervisor, which routes the control socket's commands and
SIGHUP here and advances the reload on its loop's ticks: a change sees the
master only through :class:`~appliance.master.reload.Slots` (the layout and
the children in it) and whether it is draining.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.client import inline
from appliance.config.reader import load
from appliance.config.settings import ApplianceConfig, write_snapshot
from appliance.core.tree import Tree
from appliance.formats.torchserve.store import UNREGISTERED
from appliance.master import served, systemd
from appliance.master.reload import Reload, Slots

log = logging.getLogger("appliance.master")


class ModelChanges:
    """The config as loads, unloads and reloads have changed it, and the reload applying one.

    Args:
        config: the config file's, as the appliance starts.
        config_path: the file a reload reads again.
        tree: where config snapshots and the models' own files go.
        slots: the master's layout and children, which a reload changes.
        draining: whether the appliance is draining (nothing changes then).
    """

    def __init__(
        self,
        config: ApplianceConfig,
        config_path: Path | None,
        tree: Tree,
        slots: Slots,
        draining: Callable[[], bool],
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.tree = tree
        self.slots = slots
        self.draining = draining
        self.reloading: Reload | None = None
        self.reloads = 0
        # The config file's models as loads and unloads have changed them.
        self.served = served.ServedModels(config.models, tree.inline_dir, config.ensembles)
        # A model store's archives --models did not name: registered later, if at all.
        waiting = [m.name for m in config.models if m.options.get(UNREGISTERED)]
        if waiting:
            self.served.unloaded.update(waiting)
            self.config = dataclasses.replace(config, models=self.served.models())
        if "*" not in config.server.load_models:
            # Known, not served until a load names it (Triton's explicit control).
            wanted = set(config.server.load_models)
            names = [m.name for m in config.models] + [e.name for e in config.ensembles]
            self.served.unloaded.update(name for name in names if name not in wanted)
            for name in sorted(wanted - set(names)):
                log.warning("server.load_models: no model %r in the config or repositories", name)
            self.config = dataclasses.replace(
                config, models=self.served.models(), ensembles=self.served.ensembles()
            )

    def reload(self) -> dict[str, Any]:
        """Read the config file again and swap in changed models (see reload.py).

        Raises:
            ConfigError: the new config is invalid; nothing changes.
            RuntimeError: the appliance is draining or already reloading.
        """
        self._check_can_reload()
        new = load(self.config_path)
        for section in ("server", "http", "grpc", "mip", "shm"):
            if getattr(new, section) != getattr(self.config, section):
                log.warning("reload: [%s] changed; that takes a restart", section)
        self.served.use(new)
        return self._apply()

    def unload(self, model: str) -> dict[str, Any]:
        """Stop serving ``model`` until it is loaded again (a reload without it)."""
        self._check_can_reload()
        if model not in self.slots.layout and self.config.ensemble(model) is None:
            raise RuntimeError(f"failed to unload: model {model!r} is not loaded")
        return self._apply(self.served.unload(model))

    def load_model(
        self, model: str, overrides: dict[str, Any] | None = None, directory: str | None = None
    ) -> dict[str, Any]:
        """Serve ``model`` again, from the config file as it is now (a reload).

        ``overrides`` replaces some of its ``[[models]]`` keys (see
        ``config_reader.with_overrides``) until it is loaded again without them.
        ``directory`` is a model directory a frontend wrote the model's own
        files into (under this tree's ``inline_dir``): the model is served
        from it, in place of any configured model of that name, until it is
        loaded without one or unloaded; then the directory is removed.
        """
        self._check_can_reload()
        path = Path(directory) if directory else None
        return self._apply(self.served.load(model, overrides, path, self.config_path), model)

    def advance(self) -> None:
        """Move the reload under way on; once it is done, tell systemd so."""
        if self.reloading is None:
            return
        self.reloading.advance()
        if self.reloading.done:
            self.reloading = None
            systemd.notify("READY=1", "STATUS=reload done")

    def _check_can_reload(self) -> None:
        if self.draining():
            raise RuntimeError("the appliance is draining")
        if self.reloading is not None:
            raise RuntimeError(f"a reload is in progress: {self.reloading.summary()}")

    def _apply(self, dropped: Path | None = None, loaded: str = "") -> dict[str, Any]:
        """Serve what ``self.served`` says (see reload.py); then remove ``dropped``,
        the directory of files a model no longer serves from. ``loaded``: the
        model a load names, started again if its every instance failed."""
        merged = dataclasses.replace(
            self.config, models=self.served.models(), ensembles=self.served.ensembles()
        )
        ensembles = served.ensemble_changes(self.config.ensembles, merged.ensembles)
        self.reloads += 1
        systemd.notify("RELOADING=1", systemd.monotonic_usec(), "STATUS=reloading")
        reload = Reload(self.slots, self.config, merged, self.reloads, self.tree.dir, loaded)
        reload.start()
        self.config = merged
        write_snapshot(merged, self.tree.snapshot_path)
        if any(ensembles.values()):
            self.slots.write_layout()  # clients read the snapshot's ensembles on a new layout
        self.reloading = None if reload.done else reload
        if reload.done:
            systemd.notify("READY=1", "STATUS=reload done")
        if dropped is not None:
            inline.remove(dropped)
        return {**reload.summary(), "ensembles": ensembles}
