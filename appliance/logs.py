"""Logging setup: one line per record, naming the process's role and pid.

Children inherit the master's stderr, so under systemd every process of the
tree lands in one journal, and in a terminal in one stream.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys

_FORMAT = "%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s"
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


class JsonLines(logging.Formatter):
    """One JSON object per record; access records (see metrics.log_access) by field."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, object] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "role": getattr(record, "role", _role),
            "pid": record.process,
        }
        fields = getattr(record, "access", None)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line.update(logger=record.name, level=record.levelname, message=record.getMessage())
        return json.dumps(line)


def set_access_log(setting: bool | str) -> None:
    """Set the access log (logger ``appliance.access``, one record per request).

    Args:
        setting: ``server.access_log``: True or "text" for text lines in the
            common format, "json" for JSON lines, False for none.
    """
    logger = logging.getLogger(_ACCESS)
    logger.setLevel(logging.INFO if setting else logging.WARNING)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.propagate = setting != "json"
    if setting == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines())
        handler.addFilter(_RoleFilter(_role))
        logger.addHandler(handler)


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
    handler.setFormatter(logging.Formatter(_FORMAT, "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_RoleFilter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
