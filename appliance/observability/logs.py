"""Logging setup: one line per record, naming the process's role and pid.

Children inherit the master's stderr, so under systemd every process of the
tree lands in one journal, and in a terminal in one stream. Access lines
(one per request, ``server.access_log``) go to the same stream, written
directly rather than as logging records (see :class:`_AccessLines`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import time

import orjson

_FORMAT = "%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s"
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
_ACCESS = "appliance.access"
# The role setup() was last given: JSON access lines name it too.
_role = "appliance"


class _RoleFilter(logging.Filter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


class _AccessLines:
    """Writes access lines (one per request) straight to stderr.

    PERF: a line through the logging module (a LogRecord with its caller
    lookup, the filters, the formatter) cost ~16 us of a frontend's CPU;
    built here it costs ~3 us. The text line is the one the logging format
    gives (see ``_FORMAT``), and it is written under the stderr handler's
    lock, so it never interleaves with other records.
    """

    def __init__(self) -> None:
        self.form: bool | str = True
        # (second, its text): one tuple, so threads never pair one's second with another's text.
        self._stamp = (-1, "")

    def write(
        self, protocol: str, model: str, status: str, latency_ms: float, request: str
    ) -> None:
        """Write one access line, in the form set (only that form is built)."""
        now = time.time()
        if self.form == "json":
            created = datetime.datetime.fromtimestamp(now, datetime.UTC)
            fields = {
                "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "role": _role,
                "pid": os.getpid(),
                "protocol": protocol,
                "model": model or None,
                "status": status,
                "latency_ms": round(latency_ms, 3),
                "request": request or None,
            }
            line = orjson.dumps(fields).decode() + "\n"
        else:
            text = f"{protocol} model={model or '-'} status={status} latency_ms={latency_ms:.2f}"
            if request:
                text = f"{text} {request}"
            line = f"{self._asctime(now)} INFO    {_role}[{os.getpid()}] {_ACCESS}: {text}\n"
        # The handler setup() installed, wherever it writes now.
        handlers = logging.root.handlers
        handler = handlers[0] if handlers else None
        # As a logging handler would, a stream that cannot take the line (a
        # closed pipe, a full disk) loses the line, never the request.
        with contextlib.suppress(OSError, ValueError):
            if not isinstance(handler, logging.StreamHandler):
                sys.stderr.write(line)
                return
            handler.acquire()
            try:
                handler.stream.write(line)
                handler.stream.flush()
            finally:
                handler.release()

    def _asctime(self, now: float) -> str:
        second, text = self._stamp
        if int(now) != second:
            second = int(now)
            text = time.strftime(_DATE_FORMAT, time.localtime(second))
            self._stamp = (second, text)
        return text


_access = _AccessLines()


def set_access_log(setting: bool | str) -> None:
    """Set the access log (one line per request, see :func:`access`).

    Args:
        setting: ``server.access_log``: True or "text" for text lines in the
            common format, "json" for JSON lines, False for none.
    """
    _access.form = setting


def access(protocol: str, model: str, status: str, latency_ms: float, request: str = "") -> None:
    """Write one access line, if the access log is on.

    Args:
        protocol, model, status: the request's; ``model`` is empty when it named none.
        latency_ms: from the request's arrival to its answer.
        request: what was asked (an HTTP method and path, a gRPC method), if anything.
    """
    if _access.form:
        _access.write(protocol, model, status, latency_ms, request)


def setup(role: str, level: str = "info") -> None:
    """Send every record to stderr tagged with ``role``; replace old handlers.

    Args:
        role: the process's name in logs, e.g. ``master`` or ``model[simple#0]``.
        level: debug, info, warning or error (or APPLIANCE_LOG_LEVEL overrides).
    """
    global _role
    _role = role
    level = os.environ.get("APPLIANCE_LOG_LEVEL", level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    handler.addFilter(_RoleFilter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
