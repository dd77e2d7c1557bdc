"""Reload: read the config again and change the served models without downtime.

The steps, for each model whose ``[[models]]`` entry was added or changed:

1. start its new instances in free slots, with a snapshot of the new config;
2. once all of them are ready, point the layout (model -> slots) at them
   and bump the layout generation, so every client routes to them at once;
3. retire the old instances: mark their slots STOPPING (no new requests go
   there), and after ``RETIRE_DELAY_S`` send SIGTERM; each finishes what it
   holds, idles briefly for stragglers and exits.

A removed model leaves the layout and retires the same way. A new instance
that fails to load, or is not ready within ``READY_TIMEOUT_S``, is stopped
and the old ones keep serving. Only ``[[models]]`` are reloaded: changes to
other sections are reported and need a restart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Protocol

from appliance.config.settings import ApplianceConfig, ModelConfig, write_snapshot
from appliance.core.status import SlotState, StatusTable
from appliance.errors import ErrorCode
from appliance.master.children import Child
from appliance.master.plan import model_specs
from appliance.processes.exitcodes import ExitCode

log = logging.getLogger("appliance.master")

READY_TIMEOUT_S = 300.0


class Slots(Protocol):
    """What a reload needs of the master: the layout and the children in it."""

    @property
    def status(self) -> StatusTable: ...

    layout: dict[str, list[int]]

    def model_children(self, model: str) -> list[Child]: ...

    def write_layout(self) -> None: ...

    def allocate_slot(self) -> int: ...

    def adopt(self, child: Child) -> None: ...

    def retire(self, children: list[Child]) -> None: ...

    # model -> (error code, why) of its last failed load, until one succeeds.
    failed_loads: dict[str, tuple[int, str]]


class Reload:
    """One reload in progress, from the ``old`` config to the ``new``.

    Its config snapshot goes into ``tree_dir`` (``config-<generation>.json``).
    """

    def __init__(
        self,
        slots: Slots,
        old_config: ApplianceConfig,
        new: ApplianceConfig,
        generation: int,
        tree_dir: Path,
        loaded: str = "",
    ) -> None:
        self.slots = slots
        self.new = new
        self.generation = generation
        self.tree_dir = tree_dir
        old = {model.name: model for model in old_config.models}
        fresh = {model.name: model for model in new.models}
        self.added = [name for name in fresh if name not in old]
        self.removed = [name for name in old if name not in fresh]
        # A model without instances (its last load failed) starts again; so
        # does the model a load names when its every instance failed to start
        # (a load retries it now, as Triton's does, and says how it went).
        self.changed = [
            name
            for name in fresh
            if name in old
            and (
                old[name] != fresh[name]
                or name not in slots.layout
                or (name == loaded and not self._any_alive(name))
            )
        ]
        self.unchanged = [name for name in fresh if name in old and name not in self.changed]
        self.pending: dict[str, list[Child]] = {}
        self.started = time.monotonic()

    def _any_alive(self, name: str) -> bool:
        slots = self.slots.layout[name]
        return any(self.slots.status.hot(slot)[0] != SlotState.FAILED for slot in slots)

    @property
    def done(self) -> bool:
        return not self.pending

    def summary(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "pending": sorted(self.pending),
        }

    def start(self) -> None:
        """Start new instances and retire removed models."""
        sup = self.slots
        snapshot = self.tree_dir / f"config-{self.generation}.json"
        write_snapshot(self.new, snapshot)
        for name in self.removed:
            old = sup.model_children(name)
            del sup.layout[name]
            sup.write_layout()
            sup.retire(old)
            log.info("reload: model %s removed", name)
        for model in self.new.models:
            if model.name in self.added or model.name in self.changed:
                self.pending[model.name] = self._start_model(model, snapshot)
        log.info(
            "reload: %d added, %d changed, %d removed, %d unchanged",
            len(self.added),
            len(self.changed),
            len(self.removed),
            len(self.unchanged),
        )

    def _start_model(self, model: ModelConfig, snapshot: Path) -> list[Child]:
        sup = self.slots
        slots = [sup.allocate_slot() for _ in range(model.instances)]
        children = [Child(spec) for spec in model_specs(model, slots, snapshot, self.generation)]
        for child in children:
            sup.adopt(child)
        return children

    def advance(self) -> None:
        """Swap in every model whose new instances are all ready."""
        sup = self.slots
        overdue = time.monotonic() - self.started > READY_TIMEOUT_S
        for name, children in list(self.pending.items()):
            states = [sup.status.hot(child.spec.slot)[0] for child in children]
            if all(state == SlotState.READY for state in states):
                old = sup.model_children(name)
                sup.layout[name] = [child.spec.slot for child in children]
                sup.write_layout()
                sup.retire(old)
                del self.pending[name]
                sup.failed_loads.pop(name, None)
                log.info("reload: model %s now served by its new instances", name)
            elif overdue or any(state == SlotState.FAILED for state in states):
                notes = {sup.status.read(child.spec.slot).note for child in children} - {""}
                reason = next(iter(notes), "not ready in time")
                code = _load_error(children)
                sup.failed_loads[name] = (int(code), reason)
                log.error("reload: model %s keeps its old instances: %s", name, reason)
                sup.retire(children)
                del self.pending[name]


def _load_error(children: list[Child]) -> ErrorCode:
    """The error a failed load's caller gets: what the instances' exits say."""
    exits = {child.exit_code for child in children}
    if ExitCode.NO_SHARED_MEMORY in exits:
        return ErrorCode.OVERLOADED
    if ExitCode.MODEL_LOAD_ERROR in exits:
        # The model's files are at fault (Triton answers a failed load with
        # INVALID_ARG too): loading them again as they are cannot help.
        return ErrorCode.BAD_REQUEST
    return ErrorCode.MODEL_NOT_READY
