"""What the master serves: the config's models and ensembles, as loads and unloads change them.

:class:`ServedModels` keeps the config file's models and ensembles, the ones unloaded at
run time (an ensemble too: it is no longer served until loaded, while its
step models serve on), each load's overrides of ``[[models]]`` keys (until the model is
loaded without them) and the models loaded from files shipped in the load
request (Triton's ``file:`` loads, :class:`InlineModels`).

For a ``file:`` load, a frontend writes the files into ``<tree>/inline/<random>/<model>/``, laid
out as a model repository's directory, and names that directory in its
``load`` command. The master reads it like a repository model and serves
what it holds in place of any configured model of that name, until the
model is loaded without files or unloaded; then the directory goes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from appliance.config.reader import load, repository_model, with_overrides
from appliance.config.settings import ApplianceConfig, EnsembleConfig, ModelConfig
from appliance.formats import repository


class InlineModels:
    """The models loaded from shipped files, by the name they were loaded as."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._by_model: dict[str, tuple[Path, tuple[ModelConfig, ...]]] = {}

    def read(self, model: str, directory: Path) -> tuple[ModelConfig, ...]:
        """Check a frontend's model directory and return the entries it serves.

        Raises:
            RuntimeError: it is not a directory under this tree's inline root
                named after the model, or the model in it cannot be served.
        """
        root = Path(os.path.realpath(self.root))
        real = Path(os.path.realpath(directory))
        if real.parent.parent != root or real.name != model or not real.is_dir():
            raise RuntimeError(
                f"failed to load: {directory} is not a model directory under {root} named {model!r}"
            )
        found = []
        for entry in repository.model_entries(real, "latest"):
            if entry.get("class") == repository.BROKEN_CLASS:
                raise RuntimeError(f"failed to load: model {model!r}: {entry['options']['reason']}")
            missing = repository.missing_runtime(entry)
            if missing:
                raise RuntimeError(f"failed to load: model {model!r}: {missing}")
            found.append(repository_model(entry, f"the files of {model}"))
        return tuple(found)

    def replace(
        self, model: str, directory: Path | None, entries: tuple[ModelConfig, ...] = ()
    ) -> Path | None:
        """Serve ``model`` from ``directory`` (None: from the config again).

        Returns the directory it served from before, to remove once the
        change is applied (``appliance.client.inline.remove``, which wrote it).
        """
        before = self._by_model.pop(model, None)
        if directory is not None:
            self._by_model[model] = (directory, entries)
        return before[0] if before else None

    def served(self, configured: tuple[ModelConfig, ...]) -> list[ModelConfig]:
        """The configured models, each one loaded from files replaced by what they hold."""
        shipped = [entry for _, entries in self._by_model.values() for entry in entries]
        names = {entry.name for entry in shipped}
        return [m for m in configured if m.name not in names] + shipped


class ServedModels:
    """The models to serve, from the config and the loads and unloads since."""

    def __init__(
        self,
        configured: tuple[ModelConfig, ...],
        inline_root: Path,
        ensembles: tuple[EnsembleConfig, ...] = (),
    ) -> None:
        self.configured = configured
        self.configured_ensembles = ensembles
        self.unloaded: set[str] = set()
        # model -> the [[models]] keys its last load overrode (until it loads without).
        self.overrides: dict[str, dict[str, Any]] = {}
        self.inline = InlineModels(inline_root)

    def models(self) -> tuple[ModelConfig, ...]:
        """The configured models less the unloaded ones, with overrides and files applied."""
        return tuple(
            with_overrides(m, self.overrides[m.name]) if m.name in self.overrides else m
            for m in self.inline.served(self.configured)
            if m.name not in self.unloaded
        )

    def use(self, config: ApplianceConfig) -> None:
        """Serve what the config file says now (a reload); unloads and overrides stay."""
        self.configured = config.models
        self.configured_ensembles = config.ensembles

    def ensembles(self) -> tuple[EnsembleConfig, ...]:
        """The configured ensembles less the unloaded ones."""
        return tuple(e for e in self.configured_ensembles if e.name not in self.unloaded)

    def unload(self, model: str) -> Path | None:
        """Stop serving ``model``; return the directory of its files to remove, if any."""
        self.unloaded.add(model)
        self.overrides.pop(model, None)
        return self.inline.replace(model, None)

    def load(
        self,
        model: str,
        overrides: dict[str, Any] | None,
        directory: Path | None,
        config_path: Path | None,
    ) -> Path | None:
        """Serve ``model`` again: from ``directory`` (a ``file:`` load) or from the
        config file as it is now, with ``overrides``; return the directory of
        files it served from before, to remove once the change is applied.

        Raises:
            RuntimeError: the model is in neither; ConfigError: a bad override.
        """
        if directory is None:
            fresh = load(config_path)
            configured = fresh.models
            entries = tuple(each for each in configured if each.name == model)
            if not entries and fresh.ensemble(model) is not None:
                self._load_ensemble(model, overrides, fresh)
                return None
            if not entries:
                raise RuntimeError(
                    f"failed to load: model {model!r} is not in the config {config_path}"
                )
            self.configured_ensembles = fresh.ensembles
        else:
            configured = self.configured
            entries = self.inline.read(model, directory)
        if overrides:
            for entry in entries:
                if entry.name == model:  # refuse a bad override before anything changes
                    with_overrides(entry, overrides)
            self.overrides[model] = dict(overrides)
        else:
            self.overrides.pop(model, None)
        self.unloaded.discard(model)
        self.configured = configured
        return self.inline.replace(model, directory, entries)

    def _load_ensemble(
        self, name: str, overrides: dict[str, Any] | None, fresh: ApplianceConfig
    ) -> None:
        """Serve ensemble ``name`` again, as the config file declares it now.

        Raises:
            RuntimeError: overrides were given; an ensemble has no worker keys.
        """
        if overrides:
            raise RuntimeError(
                f"failed to load: {name!r} is an ensemble: it has no [[models]] keys to "
                f"override ({', '.join(sorted(overrides))}); its steps' models have theirs"
            )
        self.unloaded.discard(name)
        self.configured = fresh.models
        self.configured_ensembles = fresh.ensembles


def ensemble_changes(
    old: tuple[EnsembleConfig, ...], new: tuple[EnsembleConfig, ...]
) -> dict[str, list[str]]:
    """Which ensembles a change of the served config adds, changes and removes."""
    before = {ensemble.name: ensemble for ensemble in old}
    after = {ensemble.name: ensemble for ensemble in new}
    return {
        "added": [name for name in after if name not in before],
        "changed": [name for name in after if name in before and before[name] != after[name]],
        "removed": [name for name in before if name not in after],
    }
