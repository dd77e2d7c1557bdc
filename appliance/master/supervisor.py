"""The master: start every child, watch them, restart them, drain, clean up.

:meth:`Supervisor.run` is one loop over one selector, which wakes for a
signal (through ``signal.set_wakeup_fd``), a control-socket connection or a
child's exit (one pidfd per child), and otherwise for the next timer: a
restart whose backoff ran out, a drain step, or the periodic housekeeping.
Signal handlers do nothing but wake the loop, so no work runs in signal
context. The master imports no frontend, protocol or worker code: it starts
them by argv and reads what they report in the status table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from appliance.client import inline
from appliance.config.reader import load
from appliance.config.settings import ApplianceConfig, ConfigError, write_snapshot
from appliance.core.segment import Space, mib
from appliance.core.status import Role, SlotState, StatusTable
from appliance.core.tree import Tree, new_tree_id
from appliance.errors import ShmExhausted
from appliance.master import commands, forks, report, served, shm, sweep, systemd, watchdog
from appliance.master.children import Child
from appliance.master.control import ControlServer
from appliance.master.drain import Drain, Step
from appliance.master.oom import OomWatch
from appliance.master.plan import Plan, make_plan
from appliance.master.ports import PortError, Ports
from appliance.master.readiness import Readiness
from appliance.master.reload import Reload
from appliance.master.stats import ProcessStats, RequestRate
from appliance.processes.control import ControlError, request
from appliance.processes.lifetime import pid_alive, raise_descriptor_limit

log = logging.getLogger("appliance.master")

HOUSEKEEPING_S = 2.0
# Between marking a retired instance STOPPING and signalling it: requests
# routed just before the mark still reach it and are served.
RETIRE_DELAY_S = 0.5
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_FRONTEND_ROLES = (Role.HTTP, Role.GRPC, Role.MIP)


class StartError(Exception):
    """The appliance cannot start; the message says why."""


class Supervisor:
    """Run one appliance process tree from a config."""

    def __init__(self, config: ApplianceConfig, config_path: Path | None = None) -> None:
        self.config = config
        self.config_path = config_path
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
        self._wakeup: tuple[int, int] | None = None
        self._housekeeping_at = 0.0
        self._drain_wake = 0.0
        self.layout: dict[str, list[int]] = {}
        self.free_slots: list[int] = []
        self.reloading: Reload | None = None
        self.failed_loads: dict[str, tuple[int, str]] = {}
        # The config file's models as loads and unloads have changed them.
        self.served = served.ServedModels(config.models, self.tree.inline_dir, config.ensembles)
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
        self.rate = RequestRate()
        self.reloads = 0
        self.watchdog = watchdog.Watchdog()
        self.zygote: forks.Zygote | None = None
        self.shm_fit = shm.Fit(0, 0, Space(0, 0))
        self.oom = OomWatch()

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
        if self.reloading is not None:
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
            if self.reloading is not None:
                self.reloading.advance()
                if self.reloading.done:
                    self.reloading = None
                    systemd.notify("READY=1", "STATUS=reload done")
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
        self._refuse_second_instance()
        try:
            tree.check_paths()
        except ValueError as ex:
            raise StartError(str(ex)) from None
        tree.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._lock_fd = sweep.lock_tree(tree)
        except OSError as ex:
            raise StartError(f"cannot create the tree's lock file in /dev/shm: {ex}") from None
        sweep.sweep_stale(tree.id)
        self._sweep_stale_dirs()
        tree.dir.mkdir(mode=0o700)
        tree.metrics_dir.mkdir()
        try:
            held = self._held = Ports(self.config)
        except PortError as ex:
            raise StartError(str(ex)) from None
        self.ports = held.by_name
        self.plan = make_plan(self.config, held, tree.snapshot_path)
        self._status = self._make_status_table()
        self.status.online = self.config.server.start_online
        write_snapshot(self.config, tree.snapshot_path)
        self.layout = {name: list(slots) for name, slots in self.plan.model_slots.items()}
        self.free_slots = list(range(self.plan.first_spare, self.plan.n_slots))
        self.write_layout()
        self._install_signals()
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
        # Frontends import while the zygote does; model workers wait for it.
        for child in sorted(self.children, key=lambda c: c.spec.is_model):
            if child.spec.is_model:
                self.zygote.wait_ready()
            self._spawn(child)
        self._write_state()

    def _make_status_table(self) -> StatusTable:
        """The status table, once the config's rings are known to fit /dev/shm (shm.py)."""
        fit = self.shm_fit = shm.fit(self.config, Space.now(), StatusTable.size(self.plan.n_slots))
        if fit.refused:
            raise StartError(f"shared memory: {fit.message}")
        if fit.cap:
            log.warning("shared memory: %s", fit.message)
        try:
            status = StatusTable.create(self.tree.status_name, self.plan.n_slots, os.getpid())
        except ShmExhausted as ex:
            raise StartError(str(ex)) from None
        status.ring_cap = fit.cap
        return status

    def _refuse_second_instance(self) -> None:
        path = self.tree.control_path
        if not path.exists():
            return
        with contextlib.suppress(ControlError, OSError):
            reply = request(path, "status", timeout_s=2.0)
            raise StartError(
                f"another appliance (pid {reply.get('pid')}) is running with run_dir "
                f"{self.tree.run_dir}; stop it or set server.run_dir"
            )

    def _sweep_stale_dirs(self) -> None:
        for entry in self.tree.run_dir.iterdir():
            if entry.is_dir() and not (Path("/dev/shm") / f"appliance-{entry.name}-lock").exists():
                shutil.rmtree(entry, ignore_errors=True)

    def _install_signals(self) -> None:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wakeup = (read_fd, write_fd)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for signum in _HANDLED:
            signal.signal(signum, _wake_only)
        self.selector.register(read_fd, selectors.EVENT_READ, self._on_signals)

    def _on_signals(self) -> None:
        assert self._wakeup is not None
        try:
            data = os.read(self._wakeup[0], 512)
        except BlockingIOError:
            return
        for signum in data:
            handler = getattr(self, f"handle_{signal.Signals(signum).name[3:].lower()}", None)
            if handler is not None:
                handler()

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
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
        removed = sweep.sweep_tree(self.tree)
        shutil.rmtree(self.tree.dir, ignore_errors=True)
        self.tree.state_path.unlink(missing_ok=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.debug("removed %d shared-memory segments", removed)

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

    # -- reload -----------------------------------------------------------------

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
        if model not in self.layout and self.config.ensemble(model) is None:
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

    def _check_can_reload(self) -> None:
        if self.drain.active:
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
        reload = Reload(self, self.config, merged, self.reloads, self.tree.dir, loaded)
        reload.start()
        self.config = merged
        write_snapshot(merged, self.tree.snapshot_path)
        if any(ensembles.values()):
            self.write_layout()  # clients read the snapshot's ensembles on a new layout
        self.reloading = None if reload.done else reload
        if reload.done:
            systemd.notify("READY=1", "STATUS=reload done")
        if dropped is not None:
            inline.remove(dropped)
        return {**reload.summary(), "ensembles": ensembles}

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
        first, count = self.plan.http_worker_slots
        pids = []
        for slot in range(first, first + count):
            info = self.status.read(slot)
            if info.state is SlotState.READY and info.pid:
                pids.append(info.pid)
        return pids

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
            "reloading": self.reloading.summary() if self.reloading else None,
            "failed_loads": {
                model: {"code": code, "reason": reason}
                for model, (code, reason) in self.failed_loads.items()
            },
            "models": list(self.layout),
            "unloaded": sorted(self.served.unloaded),
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
        total = 0
        for slot in range(self.plan.n_slots):
            state, role, _instance, _pid, _generation, depth = self.status.hot(slot)
            if state in (SlotState.READY, SlotState.STOPPING) and role != Role.NONE:
                total += depth
        return total

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
        """Write ``<run_dir>/appliance.json``: how to find this tree."""
        state = {
            "tree": self.tree.id,
            "pid": os.getpid(),
            "host": self.config.server.host,
            "ports": self.ports,
            "mip_listeners": [
                {"port": port, "model": model}
                for port, model in (self._held.mip_listeners if self._held else [])
            ],
            "control_socket": str(self.tree.control_path),
            "ready": self.readiness.ready,
            "settled": self.readiness.settled,
            "online": self.status.online if self._status else False,
        }
        temp = self.tree.state_path.with_suffix(".tmp")
        temp.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
        temp.replace(self.tree.state_path)

    def _forget_dead_http_workers(self) -> None:
        """Free the slots of gunicorn workers that died (killed, or orphaned).

        gunicorn forks them, so the master sees no exit; left alone, their
        last in-flight count would hold up a drain.
        """
        first, count = self.plan.http_worker_slots
        for slot in range(first, first + count):
            state, _role, _instance, pid, _generation, _depth = self.status.hot(slot)
            if state != SlotState.EMPTY and pid and not pid_alive(pid):
                self.status.clear(slot)

    def sample_stats(self) -> list[int]:
        """Refresh RSS and CPU of every process of the tree; return their pids."""
        pids = [os.getpid(), *(c.pid for c in self.children if c.pid)]
        pids += self.http_worker_pids()
        self.stats.sample(pids)
        return pids

    def _housekeeping(self) -> None:
        self.rate.sample(self.status, (slot for slots in self.layout.values() for slot in slots))
        self._forget_dead_http_workers()
        self.status.beat_master()
        pids = self.sample_stats()
        sweep.sweep_dead_processes(self.tree, set(pids))
        forks.reap_orphans(c.pid for c in self.children if c.pid)


def _wake_only(_signum: int, _frame: object) -> None:
    """Do nothing: the wakeup fd already told the loop which signal came."""
