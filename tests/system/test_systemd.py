"""The appliance as a systemd service: the notify protocol, the unit, the install."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from tests.system.harness import ROOT, demo_models, running

UNIT = ROOT / "systemd" / "appliance.service"


class NotifyListener:
    """A NOTIFY_SOCKET as systemd would have it: a unix datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def collect(self, until: str, timeout_s: float = 60.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.sock.recv(4096).decode())
            if any(until in message.split("\n") for message in self.messages):
                return self.messages
        raise AssertionError(f"no {until} in {self.messages}")

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


def test_notify_ready_reloading_and_stopping(tmp_path: Path) -> None:
    listener = NotifyListener(Path(f"/tmp/ap-notify-{time.monotonic_ns()}.sock"))
    try:
        models = demo_models("echo", "digits")
        with running(models, env={"NOTIFY_SOCKET": str(listener.path)}) as appliance:
            listener.collect("READY=1")
            # READY=1 only once every model serves.
            client = appliance.client()
            assert all(client.model_ready(model) for model in ("echo", "digits"))
            ready = [m for m in listener.messages if "READY=1" in m.split("\n")]
            assert len(ready) == 1
            assert "STATUS=all models and frontends are ready" in ready[0]
            appliance.ctl("reload")
            listener.collect("RELOADING=1")
            reloading = next(m for m in listener.messages if "RELOADING=1" in m)
            assert "MONOTONIC_USEC=" in reloading
            appliance.process.send_signal(signal.SIGTERM)
            listener.collect("STOPPING=1")
            assert appliance.process.wait(60) == 0
    finally:
        listener.close()


def test_the_unit_verifies_and_outlasts_the_drain() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "Restart=on-failure",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "RuntimeDirectory=appliance",
        "CapabilityBoundingSet=",
    ):
        assert line in text.splitlines(), line
    config = tomllib.loads((ROOT / "systemd" / "config.toml").read_text())
    server = config["server"]
    stop_timeout = int(text.split("TimeoutStopSec=")[1].split()[0])
    assert stop_timeout > server["drain_timeout_s"] + 2 * server["stop_timeout_s"]
    assert server["run_dir"] == "/run/appliance"


def install_systemd(tmp_path: Path, native: bool) -> tuple[Path, Path, Path]:
    """``make install-systemd`` into ``tmp_path``: its prefix, config and unit directories."""
    prefix, sysconf, units = tmp_path / "opt", tmp_path / "etc", tmp_path / "units"
    subprocess.run(
        [
            "make",
            "--no-print-directory",
            "install-systemd",
            f"PREFIX={prefix}",
            f"SYSCONF={sysconf}",
            f"UNITDIR={units}",
            f"NATIVE={int(native)}",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=900,
    )
    return prefix, sysconf, units


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_make_install_systemd_installs_a_unit_that_verifies(tmp_path: Path) -> None:
    # The compile (a minute or two) is test_install_systemd_compiles_the_request_path's.
    prefix, sysconf, units = install_systemd(tmp_path, native=False)
    unit = (units / "appliance.service").read_text()
    assert f"ExecStart={prefix}/bin/appliance serve --config {sysconf}/config.toml" in unit
    assert "@" not in unit.replace("$MAINPID", "")
    assert (prefix / "bin" / "appliance").exists()
    assert (sysconf / "config.toml").read_text() == (ROOT / "systemd" / "config.toml").read_text()
    subprocess.run(
        ["systemd-analyze", "verify", str(units / "appliance.service")], check=True, timeout=60
    )
    help_text = subprocess.run(
        [str(prefix / "bin" / "appliance"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "serve" in help_text


@pytest.mark.long
# The install compiles 30 modules: minutes on 2 vCPUs, past the suite's default timeout.
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_install_systemd_compiles_the_request_path(tmp_path: Path) -> None:
    prefix, _sysconf, _units = install_systemd(tmp_path, native=True)
    shown = subprocess.run(
        [
            str(prefix / "bin" / "python"),
            "-c",
            "from appliance import native; from appliance.worker import server; "
            "print(native.state()); print(server.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.splitlines()
    assert shown[0] == "compiled (mypyc)"
    assert shown[1].startswith(str(prefix))
    assert shown[1].endswith(".so")
    # Nothing of the build is left in the installed package.
    site = Path(shown[1]).parents[2]
    assert not (site / "build").exists()
    assert not (site / ".mypy_cache").exists()
