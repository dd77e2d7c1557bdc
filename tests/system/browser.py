"""Drive Debian's headless chromium over the DevTools protocol, stdlib only.

Chromium started with ``--remote-debugging-pipe`` reads DevTools commands
from fd 3 and writes replies and events to fd 4, each message JSON ended by
a NUL byte (as Playwright and Puppeteer use it). No websocket, no port, and
no package beyond the browser itself.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--disable-default-apps",
    # A page polls on a timer: never throttle it as a background tab.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--remote-debugging-pipe",
)


class BrowserError(Exception):
    """Chromium failed, answered a command with an error, or took too long."""


class Browser:
    """One headless chromium and one page in it."""

    def __init__(self, process: subprocess.Popen[bytes], send_fd: int, receive_fd: int) -> None:
        self.process = process
        self.send_fd = send_fd
        self.receive_fd = receive_fd
        self.buffer = b""
        self.ids = itertools.count(1)
        self.session = ""

    def call(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Send one command (to the page once attached) and return its result."""
        number = next(self.ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self.send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == number:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self.receive_fd], [], [], left)
            if ready:
                chunk = os.read(self.receive_fd, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium exited ({self.process.poll()})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\0", 1)
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        """Open ``url`` in a new page and wait until it has loaded."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        """Return the value of a JavaScript expression in the page."""
        reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in reply:
            raise BrowserError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        """Save the whole page as a PNG."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        width = int(self.evaluate("document.documentElement.scrollWidth"))
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close", timeout_s=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.send_fd)
        os.close(self.receive_fd)


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Run a headless chromium with a throwaway profile for a ``with`` block."""
    if CHROMIUM is None:
        raise BrowserError("chromium is not installed (apt-get install -y chromium)")
    profile = Path(tempfile.mkdtemp(prefix="chromium-"))
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def pipes_on_3_and_4() -> None:
        # Move both ends above 4 first, so neither dup2 overwrites the other.
        read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)

    with (profile / "chromium.log").open("wb") as log:
        process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=False,
            preexec_fn=pipes_on_3_and_4,
        )
    os.close(to_browser_r)
    os.close(from_browser_w)
    browser = Browser(process, to_browser_w, from_browser_r)
    try:
        yield browser
    except BaseException:
        print((profile / "chromium.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)
