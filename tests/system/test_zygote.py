"""Model workers forked from the zygote behave as the master's own children.

They are the master's children (it waits for them, their death signal
follows it), they share the zygote's pages, a stuck zygote is replaced while
workers start with a fresh exec, a reload loads a model file changed on disk,
and orphans the master inherits as a subreaper are reaped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tomli_w

from appliance.client.api import ModelClient
from tests.system.harness import (
    ROOT,
    Appliance,
    demo_models,
    eventually,
    make_config,
    new_run_dir,
    running,
    serving,
)

MiB = 1 << 20

# A model whose answer is set in its source file, and which may leave a
# process behind: what a reload must load again, and an orphan to reap.
MODEL_SOURCE = """
import subprocess
from pathlib import Path

import numpy as np

from appliance.model import Model, spec


class Answer(Model):
    inputs = [spec("x", "INT32", [1])]
    outputs = [spec("y", "INT32", [1])]

    def load(self):
        marker = Path(self.options["dir"]) / "spawned"
        if self.options.get("spawn") and not marker.exists():
            sleeper = subprocess.Popen(["sleep", "300"])
            marker.write_text(str(sleeper.pid))

    def predict(self, inputs, parameters):
        return {"y": inputs["x"] + ANSWER}
"""


def pid_of(appliance: Appliance, role: str) -> int | None:
    """The pid of a running process, None while it is down."""
    with contextlib.suppress(LookupError):
        return appliance.pid_of(role)
    return None


def parent_of(pid: int) -> int:
    return psutil.Process(pid).ppid()


def answer(client: ModelClient, model: str = "answer") -> int:
    with client.infer(model, {"x": np.zeros(1, np.int32)}) as result:
        return int(result.array("y")[0])


def write_model(where: Path, value: int) -> None:
    where.joinpath("zygote_answer.py").write_text(
        textwrap.dedent(MODEL_SOURCE) + f"\nANSWER = {value}\n"
    )


@contextlib.contextmanager
def answer_model(spawn: bool = False) -> Iterator[tuple[Appliance, Path]]:
    """An appliance serving ``answer`` (ANSWER = 1) from a module in a temporary directory."""
    run_dir = new_run_dir()
    # Not under run_dir, whose directories the master sweeps at start.
    where = Path(tempfile.mkdtemp(prefix="ap-models-"))
    write_model(where, 1)
    model = {
        "name": "answer",
        "class": "zygote_answer:Answer",
        "options": {"dir": str(where), "spawn": spawn},
    }
    config = make_config(run_dir, [model, *demo_models("simple")])
    config["server"]["python_path"] = [str(ROOT), str(where)]
    try:
        with serving(config) as appliance:
            yield appliance, where
    finally:
        marker = where / "spawned"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(marker.read_text()), signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("mode", ["zygote", "exec"])
def test_model_workers_are_the_masters_children_and_forked_ones_share_pages(mode: str) -> None:
    with running(demo_models("simple", "echo"), server={"model_start": mode}) as appliance:
        master = appliance.process.pid
        rows = {row["role"]: row for row in appliance.processes()}
        assert ("zygote" in rows) == (mode == "zygote")
        for role in ("model[simple#0]", "model[echo#0]"):
            assert parent_of(rows[role]["pid"]) == master
        verb = "forked" if mode == "zygote" else "started"
        assert f"{verb} model[simple#0] (pid {rows['model[simple#0]']['pid']})" in appliance.log()
        worker = rows["model[simple#0]"]["pid"]
        # systemd counts it in the service's cgroup, as any child.
        cgroup = Path(f"/proc/{master}/cgroup").read_text()
        assert Path(f"/proc/{worker}/cgroup").read_text() == cgroup
        if mode == "zygote":
            zygote = rows["zygote"]
            assert zygote["state"] == "ready"
            assert parent_of(zygote["pid"]) == master
            # simple's ring is sized to its outputs (1 MiB); the rest is shared with the zygote.
            unique = psutil.Process(rows["model[simple#0]"]["pid"]).memory_full_info().uss
            assert unique < 20 * MiB, f"a forked simple worker holds {unique / MiB:.1f} MiB"
        client = appliance.client()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        with client.infer("simple", {"INPUT0": a, "INPUT1": a}) as result:
            assert result.array("OUTPUT0").tolist() == (2 * a).tolist()
        # Its metrics go to files of its own pid (prometheus_client sees the fork),
        # none to the zygote's.
        metrics = appliance.run_dir / appliance.tree / "metrics"
        assert eventually(lambda: any(metrics.glob(f"*_{worker}.db")), 10.0)
        if mode == "zygote":
            assert not list(metrics.glob(f"*_{rows['zygote']['pid']}.db"))


def test_a_stuck_zygote_is_replaced_and_workers_exec_meanwhile() -> None:
    with running(demo_models("simple")) as appliance:
        client = appliance.client()
        zygote = appliance.pid_of("zygote")
        victim = appliance.pid_of("model[simple#0]")
        os.kill(zygote, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        # The fork request times out (3 s), the zygote is killed, the worker execs.
        assert eventually(lambda: pid_of(appliance, "model[simple#0]") not in (None, victim), 20.0)
        replacement = appliance.pid_of("model[simple#0]")
        assert eventually(lambda: client.model_ready("simple"), 20.0)
        assert f"started model[simple#0] (pid {replacement})" in appliance.log()
        assert "the zygote failed to fork" in appliance.log()
        assert not psutil.pid_exists(zygote) or psutil.Process(zygote).status() == "zombie"
        # Its successor forks the next one.
        assert eventually(lambda: pid_of(appliance, "zygote") not in (None, zygote), 20.0)
        assert eventually(
            lambda: any(
                r["role"] == "zygote" and r["state"] == "ready" for r in appliance.processes()
            ),
            20.0,
        )
        os.kill(replacement, signal.SIGKILL)
        assert eventually(
            lambda: pid_of(appliance, "model[simple#0]") not in (None, replacement), 20.0
        )
        third = appliance.pid_of("model[simple#0]")
        assert eventually(lambda: client.model_ready("simple"), 20.0)
        assert f"forked model[simple#0] (pid {third})" in appliance.log()
        a = np.ones((1, 16), np.int32)
        with client.infer("simple", {"INPUT0": a, "INPUT1": a}) as result:
            assert result.array("OUTPUT1").tolist() == [[0] * 16]


def test_a_reload_forks_a_worker_that_loads_the_changed_model_file() -> None:
    with answer_model() as (appliance, where):
        client = appliance.client()
        assert answer(client) == 1
        before = appliance.pid_of("model[answer#0]")
        write_model(where, 22)
        config_path = appliance.run_dir / "config.toml"
        config = tomllib.loads(config_path.read_text())
        config["models"][0]["options"]["changed"] = True
        config_path.write_text(tomli_w.dumps(config))
        appliance.ctl("reload")
        assert eventually(lambda: answer(client) == 22, 30.0)
        rows = {row["role"]: row for row in appliance.processes()}
        fresh = next(r for role, r in rows.items() if role.startswith("model[answer#0@r"))
        assert fresh["pid"] != before
        assert f"forked {fresh['role']} (pid {fresh['pid']})" in appliance.log()


def test_an_orphan_the_master_inherits_is_reaped() -> None:
    with answer_model(spawn=True) as (appliance, where):
        master = appliance.process.pid
        marker = where / "spawned"
        assert eventually(marker.exists, 10.0)
        sleeper = int(marker.read_text())
        worker = appliance.pid_of("model[answer#0]")
        assert parent_of(sleeper) == worker
        os.kill(worker, signal.SIGKILL)
        # Its orphan is handed to the master (a subreaper), not to init ...
        assert eventually(lambda: parent_of(sleeper) == master, 10.0)
        os.kill(sleeper, signal.SIGKILL)
        # ... which reaps it at its next housekeeping, so no zombie stays.
        assert eventually(lambda: not psutil.pid_exists(sleeper), 10.0)
        assert f"reaped orphan {sleeper}" in appliance.log()
        assert eventually(lambda: pid_of(appliance, "model[answer#0]") not in (None, worker), 10.0)
