"""The master: start every child, watch them, restart them, drain, clean up.

:meth:`Supervisor.run` is one loop over one selector, which wakes for a
signal (through ``signal.set_wakeup_fd``), a control-socket connection or a
child's exit (one pidfd per child), and otherwise for the next timer: a
restart whose backoff ran out, a drain step, or the periodic housekeeping.
Signal handlers do nothing but wake the loop, so no work runs in signal
context. The master imports no frontend, protocol or worker code: it starts
them by argv and reads what they report in the status table.

What needs less than the whole master lives beside it: the tree's files
(tree_files.py), the signal pipe (signals.py), loads, unloads and reloads
(model_changes.py) and the scans of the status table (slot_scans.py).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from appliance import native
from appliance.config.settings import ApplianceConfig, ConfigError, write_snapshot
from appliance.core.segment import Space, mib
from appliance.core.status import Role, SlotState, StatusTable
from appliance.core.tree import Tree, new_tree_id
from appliance.master import (
    commands,
    forks,
    report,
    shm,
    slot_scans,
    sweep,
    systemd,
    tree_files,
    watchdog,
)
from appliance.master.children import Child
from appliance.master.control import ControlServer
from appliance.master.drain import Drain, Step
from appliance.master.model_changes import ModelChanges
from appliance.master.oom import OomWatch
from appliance.master.plan import Plan, make_plan
from appliance.master.ports import PortError, Ports
from appliance.master.readiness import Readiness
from appliance.master.signals import SignalPipe
from appliance.master.stats import ProcessStats, RequestRate
from appliance.master.tree_files import StartError
from appliance.processes.lifetime import pid_alive, raise_descriptor_limit

log = logging.getLogger("appliance.master")

HOUSEKEEPING_S = 2.0
# Between marking a retired instance STOPPING and signalling it: requests
# routed just before the mark still reach it and are served.
RETIRE_DELAY_S = 0.5
_FRONTEND_ROLES = (Role.HTTP, Role.GRPC, Role.MIP)


class Supervisor:
    """Run one appliance process tree from a config."""

    def __init__(self, config: ApplianceConfig, config_path: Path | None = None) -> None:
        self.tree = Tree(new_tree_id(), config.resolved_run_dir())
        self.selector = selectors.DefaultSelector()
        self.children: list[Child] = []
        self.plan = Plan()
        self.ports: dict[str, int] = {}
        self._held: Ports | None = None
        self.stats = ProcessStats()
        self.started_at = time.time()
        self.readiness = Readiness()
        self.drain = Drain(config.server, self.go_offline, self.in_flight)
        self._lock_fd: int | None = None
        self._control: ControlServer | None = None
        self._status: StatusTable | None = None
        self._signals: SignalPipe | None = None
        self._housekeeping_at = 0.0
        self._drain_wake = 0.0
        self.layout: dict[str, list[int]] = {}
        self.free_slots: list[int] = []
        self.failed_loads: dict[str, tuple[int, str]] = {}
        self.changes = ModelChanges(config, config_path, self.tree, self, lambda: self.drain.active)
        self.rate = RequestRate()
        self.watchdog = watchdog.Watchdog()
        self.zygote: forks.Zygote | None = None
        self.shm_fit = shm.Fit(0, 0, Space(0, 0))
        self.oom = OomWatch()

    @property
    def config(self) -> ApplianceConfig:
        """The config as loads, unloads and reloads have changed it (model_changes.py)."""
        return self.changes.config

    @property
    def status(self) -> StatusTable:
        assert self._status is not None
        return self._status

    # -- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Start the tree and supervise it until it has drained; return 0."""
        try:
            self.start()
            while not self.drain.done:
                for key, _events in self.selector.select(self._timeout()):
                    callback: Callable[[], None] = key.data
                    callback()
                self._tick()
        finally:
            self.cleanup()
        log.info("stopped")
        return 0

    def _timeout(self) -> float:
        now = time.monotonic()
        waits = [self._housekeeping_at - now, self.watchdog.wait_s(now, self.config)]
        waits += [c.next_start - now for c in self.children if c.next_start is not None]
        waits += [c.retire_at - now for c in self.children if c.retire_at is not None]
        if self.changes.reloading is not None:
            waits.append(0.05)
        if self.drain.active:
            waits.append(self._drain_wake - now)
        return max(0.0, min([*waits, 1.0]))

    def _tick(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.retire_at is not None and now >= child.retire_at:
                child.retire_at = None
                child.stop()
        if not self.drain.active:
            for child in self.children:
                if child.next_start is not None and now >= child.next_start:
                    self._spawn(child)
            self.changes.advance()
        else:
            # The zygote stops with the model workers; nothing restarts while draining.
            last = [*self.models(), *self.zygotes()]
            self._drain_wake = now + self.drain.advance(self.frontends(), last)
            if self.drain.step >= Step.STOP_FRONTENDS and self._held is not None:
                self._held.close()
        if now >= self._housekeeping_at:
            self._housekeeping_at = now + HOUSEKEEPING_S
            self._housekeeping()
        self.watchdog.check(now, self.status, self.models(), self.config)
        self._update_readiness()

    # -- start and stop ---------------------------------------------------------

    def start(self) -> None:
        """Prepare the tree's files and segments, then start every child.

        Raises:
            StartError: another appliance uses the run_dir, or a port is taken.
        """
        # Everything the tree writes (state, snapshot, layout, metrics files,
        # sockets) is for this user alone; the children inherit the umask.
        os.umask(0o077)
        before, now = raise_descriptor_limit()
        if now != before:
            log.info("descriptor limit (RLIMIT_NOFILE) raised from %d to %d", before, now)
        tree = self.tree
        self._lock_fd = tree_files.claim(tree)
        tree_files.make_dirs(tree)
        try:
            held = self._held = Ports(self.config)
        except PortError as ex:
            raise StartError(str(ex)) from None
        self.ports = held.by_name
        self.plan = make_plan(self.config, held, tree.snapshot_path)
        self._status, self.shm_fit = tree_files.make_status_table(
            self.config, tree, self.plan.n_slots
        )
        self.status.online = self.config.server.start_online
        write_snapshot(self.config, tree.snapshot_path)
        self.layout = {name: list(slots) for name, slots in self.plan.model_slots.items()}
        self.free_slots = list(range(self.plan.first_spare, self.plan.n_slots))
        self.write_layout()
        handlers = {
            signal.SIGTERM: self.handle_term,
            signal.SIGINT: self.handle_int,
            signal.SIGHUP: self.handle_hup,
        }
        self._signals = SignalPipe(self.selector, handlers)
        self._control = ControlServer(tree.control_path, commands.handlers(self), self.selector)
        self.zygote = forks.Zygote.for_config(self.config, self.allocate_slot, self.status)
        self.children = [*self.zygotes(), *(Child(spec) for spec in self.plan.specs)]
        log.info(
            "starting tree %s: %d models on %s, HTTP %d, gRPC %d, MIP %s (%s)",
            tree.id,
            len(self.config.models),
            self.config.server.host,
            self.ports["http"],
            self.ports["grpc"],
            ", ".join(f"{port} -> {model}" for port, model in held.mip_listeners),
            "online" if self.status.online else "offline",
        )
        log.info("request path (model workers and frontends): %s", native.state())
        # Frontends import while the zygote does; model workers wait for it.
        for child in sorted(self.children, key=lambda c: c.spec.is_model):
            if child.spec.is_model:
                self.zygote.wait_ready()
            self._spawn(child)
        self._write_state()

    def handle_term(self) -> None:
        self.begin_drain("SIGTERM")

    def handle_int(self) -> None:
        self.begin_drain("SIGINT")

    def begin_drain(self, reason: str) -> None:
        """Go offline, finish what is in flight, stop (see drain.py)."""
        self.drain.begin(reason)

    def handle_hup(self) -> None:
        try:
            self.reload()
        except (ConfigError, RuntimeError) as ex:
            log.error("SIGHUP: reload refused, still serving the old config: %s", ex)

    def cleanup(self) -> None:
        """Kill what still runs, then remove every file and segment of the tree."""
        for child in self.children:
            if child.running:
                child.send(signal.SIGKILL)
                assert child.proc is not None
                child.proc.wait()
        if self.zygote is not None:
            self.zygote.close()
        if self._control is not None:
            self._control.close()
        if self._status is not None:
            self._status.close()
        if self._held is not None:
            self._held.close()
        if self._signals is not None:
            self._signals.close()
        tree_files.remove(self.tree, self._lock_fd)

    # -- children -------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        pidfd = child.spawn(self.tree, self.status, self.zygote.fork if self.zygote else None)
        self.selector.register(pidfd, selectors.EVENT_READ, lambda: self._on_exit(child))

    def _on_exit(self, child: Child) -> None:
        assert child.pidfd is not None
        self.selector.unregister(child.pidfd)
        pid = child.reap(self.status, self._explain_death)
        sweep.sweep_process(self.tree, pid)
        if child.retired:
            self.children.remove(child)
            self.status.clear(child.spec.slot)
            self.free_slots.append(child.spec.slot)

    def _explain_death(self, child: Child, pid: int, code: int) -> str:
        """The OOM killer's SIGKILL, told from others by the memory cgroup (oom.py)."""
        if code != -signal.SIGKILL or not self.oom.killed_since():
            return ""
        figures = self.stats.figures.get(pid)
        rss = f"; RSS {mib(figures.rss_bytes)} at the last sample" if figures else ""
        return f"out of memory, killed by the kernel's OOM killer{rss}"

    # -- loads, unloads and reloads (model_changes.py) ---------------------------

    def reload(self) -> dict[str, Any]:
        """Read the config file again and swap in changed models."""
        return self.changes.reload()

    def unload(self, model: str) -> dict[str, Any]:
        """Stop serving ``model`` until it is loaded again."""
        return self.changes.unload(model)

    def load_model(
        self, model: str, overrides: dict[str, Any] | None = None, directory: str | None = None
    ) -> dict[str, Any]:
        """Serve ``model`` again, with ``overrides``, from ``directory`` if one is given."""
        return self.changes.load_model(model, overrides, directory)

    # -- slots ------------------------------------------------------------------

    def model_children(self, model: str) -> list[Child]:
        """The children serving ``model`` now (its slots in the layout)."""
        slots = set(self.layout.get(model, ()))
        return [c for c in self.children if c.spec.model == model and c.spec.slot in slots]

    def write_layout(self) -> None:
        """Publish model -> slots to every client (layout.json, then a bump)."""
        path = self.tree.dir / "layout.json"
        temp = path.with_suffix(".tmp")
        temp.write_bytes(orjson.dumps({**self.plan.layout(), "models": self.layout}))
        temp.replace(path)
        self.status.bump_layout()

    def allocate_slot(self) -> int:
        if not self.free_slots:
            raise RuntimeError("no free status slot for a new instance; restart instead")
        self.free_slots.sort()
        return self.free_slots.pop(0)

    def adopt(self, child: Child) -> None:
        """Start a child created after start-up (a reload's new instance)."""
        self.children.append(child)
        self._spawn(child)

    def retire(self, children: list[Child]) -> None:
        """Stop routing to ``children`` now, and stop them shortly after."""
        deadline = time.monotonic() + RETIRE_DELAY_S
        for child in children:
            child.retired = True
            child.stopping = True
            child.next_start = None
            self.status.set_state(child.spec.slot, SlotState.STOPPING)
            if child.running:
                child.retire_at = deadline
            else:
                self.children.remove(child)
                self.status.clear(child.spec.slot)
                self.free_slots.append(child.spec.slot)

    def frontends(self) -> list[Child]:
        return [c for c in self.children if c.spec.status_role in _FRONTEND_ROLES]

    def models(self) -> list[Child]:
        return [c for c in self.children if c.spec.is_model]

    def zygotes(self) -> list[Child]:
        return self.zygote.children if self.zygote is not None else []

    def http_worker_pids(self) -> list[int]:
        return slot_scans.http_worker_pids(self.status, self.plan.http_worker_slots)

    # -- health -----------------------------------------------------------------

    def go_offline(self) -> None:
        self.status.online = False
        self.status.draining = True
        systemd.notify("STOPPING=1", "STATUS=draining")
        self._write_state()

    def set_online(self, online: bool) -> None:
        if self.drain.active and online:
            raise RuntimeError("the appliance is draining; it cannot go online again")
        self.status.online = online
        log.info("now %s", "online" if online else "offline")
        self._write_state()

    def report(self) -> dict[str, Any]:
        """What ``appliance ctl status`` shows (see report.py)."""
        self.sample_stats()
        return {
            "tree": self.tree.id,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "requests_per_s": round(self.rate.per_s(), 1),
            "in_flight": self.in_flight(),
            "online": self.status.online,
            "ready": self.readiness.ready,
            "draining": self.drain.active,
            "reloading": self.changes.reloading.summary() if self.changes.reloading else None,
            "failed_loads": {
                model: {"code": code, "reason": reason}
                for model, (code, reason) in self.failed_loads.items()
            },
            "models": list(self.layout),
            "unloaded": sorted(self.changes.served.unloaded),
            "ensembles": report.ensemble_rows(self.config.ensembles, self.layout, self.status),
            "ports": self.ports,
            "processes": report.process_rows(
                self.children,
                self.status,
                self.http_worker_pids(),
                self.stats.figures,
                self.drain.active,
            ),
            "sizing": report.sizing_of(self.config),
            "shm": shm.report(self.tree.id, self.shm_fit),
        }

    def in_flight(self) -> int:
        """Requests queued in model workers or in flight in frontends."""
        return slot_scans.in_flight(self.status, self.plan.n_slots)

    def _update_readiness(self) -> None:
        changed = self.readiness.update(
            self.status,
            self.frontends(),
            self.layout,
            lambda: sum(map(pid_alive, self.http_worker_pids())),
            self.config.http.workers,
        )
        if changed:
            self._write_state()

    def _write_state(self) -> None:
        """Write ``<run_dir>/appliance.json``: how to find this tree (tree_files.py)."""
        tree_files.write_state(
            self.tree,
            host=self.config.server.host,
            ports=self.ports,
            mip_listeners=self._held.mip_listeners if self._held else [],
            ready=self.readiness.ready,
            settled=self.readiness.settled,
            online=self.status.online if self._status else False,
        )

    def sample_stats(self) -> list[int]:
        """Refresh RSS and CPU of every process of the tree; return their pids."""
        pids = [os.getpid(), *(c.pid for c in self.children if c.pid)]
        pids += self.http_worker_pids()
        self.stats.sample(pids)
        return pids

    def _housekeeping(self) -> None:
        self.rate.sample(self.status, (slot for slots in self.layout.values() for slot in slots))
        slot_scans.forget_dead_http_workers(self.status, self.plan.http_worker_slots)
        self.status.beat_master()
        pids = self.sample_stats()
        sweep.sweep_dead_processes(self.tree, set(pids))
        forks.reap_orphans(c.pid for c in self.children if c.pid)
