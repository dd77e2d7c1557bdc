"""The config's ``[[models]]`` tables, and the ``[[repositories]]`` whose models join them.

:class:`ModelReader` reads a model's table (its name, class, instances,
limits, device and sequence batching keys), tells an ensemble's table (one
with steps) from a model's, and reads each ``[[repositories]]`` table and
the entries its scan finds, serving one that does not check out as Broken.
It is apart from the top-level reader (reader.py) because a model's table
is also checked alone: a load's overrides and a model loaded from shipped
files.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.config import device as devices
from appliance.config import ensembles, sizing
from appliance.config.settings import ConfigError, EnsembleConfig, ModelConfig, RepositoryConfig
from appliance.config.value_reader import ValueReader
from appliance.core.sequences import STRATEGIES
from appliance.formats import repository
from appliance.formats.model_versions import parse_versions
from appliance.formats.repository_layout import RepositoryError
from appliance.formats.torchserve.store import ENVELOPES

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


log = logging.getLogger("appliance.config")


class ModelReader(ValueReader):
    """Check ``[[models]]`` and ``[[repositories]]`` tables, naming keys."""

    def repositories(self, raw: Any) -> list[RepositoryConfig]:
        if not isinstance(raw, list):
            self.fail("repositories", "expected an array of tables ([[repositories]])")
        found = []
        for index, item in enumerate(raw):
            where = f"repositories[{index}]"
            self.no_extra(
                item, {"path", "versions", "skip_unavailable", "models", "envelope"}, where
            )
            if "path" not in item:
                self.fail(f"{where}.path", "missing; a repository needs the directory's path")
            path = Path(self.value(f"{where}.path", item["path"], "str")).expanduser()
            if not path.is_absolute():
                path = Path(self.source).parent.absolute() / path
            try:
                versions = parse_versions(item.get("versions", "latest"))
            except RepositoryError as ex:
                self.fail(f"{where}.versions", str(ex))
            skip = self.value(
                f"{where}.skip_unavailable", item.get("skip_unavailable", False), "bool"
            )
            models = self.value(f"{where}.models", item.get("models", []), "tuple[str, ...]")
            envelope = self.value(f"{where}.envelope", item.get("envelope", ""), "str")
            if envelope not in ENVELOPES:
                self.fail(
                    f"{where}.envelope",
                    f"expected one of {', '.join(repr(e) for e in ENVELOPES)}, got {envelope!r}",
                )
            found.append(
                RepositoryConfig(os.path.normpath(path), versions, skip, tuple(models), envelope)
            )
        return found

    def repository_models(
        self, repositories: tuple[RepositoryConfig, ...]
    ) -> list[ModelConfig | EnsembleConfig]:
        """Scan each repository; an entry that does not check out is served Broken."""
        models: list[ModelConfig | EnsembleConfig] = []
        for index, repo in enumerate(repositories):
            where = f"repositories[{index}]"
            try:
                entries = repository.scan(
                    Path(repo.path), repo.versions, repo.models, repo.envelope
                )
            except RepositoryError as ex:
                self.fail(f"{where}.path", str(ex))
            for entry in entries:
                missing = repository.missing_runtime(entry) if repo.skip_unavailable else None
                if missing:
                    log.warning("%s: model %s is left out: %s", where, entry["name"], missing)
                    continue
                if ensembles.is_ensemble(entry):
                    read = ensembles.from_repository(where, entry)
                    models.append(
                        read if isinstance(read, EnsembleConfig) else self.model(where, read)
                    )
                    continue
                try:
                    models.append(self.model(f"{where} model {entry['name']}", entry))
                except ConfigError as ex:
                    reason = str(ex).removeprefix(f"{self.source}: ")
                    models.append(self.model(where, repository.broken(entry["name"], reason)))
        return models

    def models(self, raw: Any) -> list[ModelConfig | EnsembleConfig]:
        if not isinstance(raw, list):
            self.fail("models", "expected an array of tables ([[models]])")
        return [self.entry(f"models[{index}]", entry) for index, entry in enumerate(raw)]

    def entry(self, where: str, data: Any) -> ModelConfig | EnsembleConfig:
        """A [[models]] table: a model class, or an ensemble (one with steps)."""
        if not isinstance(data, Mapping) or not ensembles.is_ensemble(data):
            return self.model(where, data)
        try:
            return ensembles.read(data)
        except ensembles.EnsembleError as ex:
            self.fail(where, f"ensemble {data.get('name')!r}: {ex}")

    def model_limits(self, where: str, data: Mapping[str, Any]) -> tuple[int, float | None]:
        """Read a model's max_queue and max_busy_s."""
        max_queue = self.value(f"{where}.max_queue", data.get("max_queue", 1024), "int")
        if max_queue < 1:
            self.fail(f"{where}.max_queue", f"expected an integer >= 1, got {max_queue}")
        max_busy_s = self.value(f"{where}.max_busy_s", data.get("max_busy_s"), "float | None")
        if max_busy_s is not None and max_busy_s <= 0:
            self.fail(f"{where}.max_busy_s", f"expected a number of seconds > 0, got {max_busy_s}")
        return max_queue, max_busy_s

    def model(self, where: str, data: Any) -> ModelConfig:
        known = {
            "name",
            "class",
            "instances",
            "max_batch_size",
            "max_queue_delay_ms",
            "response_ring_bytes",
            "passthrough",
            "options",
            "max_queue",
            "max_busy_s",
            "restart_wait_s",
            "device",
            "sequence_batching",
            "max_sequence_idle_s",
            "sequence_strategy",
            "max_candidate_sequences",
        }
        self.no_extra(data, known, where)
        for required in ("name", "class"):
            if required not in data:
                self.fail(f"{where}.{required}", "missing; every model needs a name and a class")
        name = self.value(f"{where}.name", data["name"], "str")
        if not _NAME.match(name):
            self.fail(f"{where}.name", f"{name!r}: use 1-63 letters, digits, '_', '.' or '-'")
        cls = self.value(f"{where}.class", data["class"], "str")
        if ":" not in cls:
            self.fail(f"{where}.class", f"expected 'module:Class', got {cls!r}")
        instances = data.get("instances", 1)
        if instances == "auto":
            self.auto.append(f"models.{name}.instances")
            instances = sizing.auto("instances", self.n_cpus)
        instances = self.value(f"{where}.instances", instances, "int")
        if instances < 1:
            self.fail(f"{where}.instances", f"expected an integer >= 1, got {instances}")
        options = data.get("options", {})
        if not isinstance(options, Mapping):
            self.fail(f"{where}.options", "expected a table")
        max_queue, max_busy_s = self.model_limits(where, data)
        restart_wait_s = self.value(
            f"{where}.restart_wait_s", data.get("restart_wait_s", 5.0), "float"
        )
        device = data.get("device", "cpu")
        problem = devices.check(device)
        if problem:
            self.fail(f"{where}.device", problem)
        return ModelConfig(
            name=name,
            cls=cls,
            instances=instances,
            max_batch_size=self.value(
                f"{where}.max_batch_size", data.get("max_batch_size"), "int | None"
            ),
            max_queue_delay_ms=self.value(
                f"{where}.max_queue_delay_ms", data.get("max_queue_delay_ms", 0.0), "float"
            ),
            response_ring_bytes=self.value(
                f"{where}.response_ring_bytes", data.get("response_ring_bytes"), "int | None"
            ),
            passthrough=self.value(f"{where}.passthrough", data.get("passthrough", True), "bool"),
            options=dict(options),
            max_queue=max_queue,
            max_busy_s=max_busy_s,
            restart_wait_s=restart_wait_s,
            device=device,
            **self.sequence_keys(where, data),
        )

    def sequence_keys(self, where: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Read a model's sequence batching keys (see appliance/core/sequences.py)."""
        idle = self.value(
            f"{where}.max_sequence_idle_s", data.get("max_sequence_idle_s", 60.0), "float"
        )
        if idle <= 0:
            self.fail(f"{where}.max_sequence_idle_s", f"expected seconds > 0, got {idle}")
        strategy = self.value(
            f"{where}.sequence_strategy", data.get("sequence_strategy", "direct"), "str"
        )
        if strategy not in STRATEGIES:
            self.fail(
                f"{where}.sequence_strategy",
                f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}",
            )
        candidates = self.value(
            f"{where}.max_candidate_sequences", data.get("max_candidate_sequences", 1024), "int"
        )
        if candidates < 1:
            self.fail(
                f"{where}.max_candidate_sequences", f"expected an integer >= 1, got {candidates}"
            )
        enabled = data.get("sequence_batching")
        return {
            "sequence_batching": None
            if enabled is None
            else self.value(f"{where}.sequence_batching", enabled, "bool"),
            "max_sequence_idle_s": idle,
            "sequence_strategy": strategy,
            "max_candidate_sequences": candidates,
        }
