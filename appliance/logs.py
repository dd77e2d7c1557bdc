"""Logging setup: one line per record, naming the process's role and pid.

Children inherit the master's stderr, so under systemd every process of the
tree lands in one journal, and in a terminal in one stream.
"""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(asctime)s %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s"


class _RoleFilter(logging.Filter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


def set_access_log(enabled: bool) -> None:
    """Turn the one-line-per-request access log (``appliance.access``) on or off."""
    logging.getLogger("appliance.access").setLevel(logging.INFO if enabled else logging.WARNING)


def setup(role: str, level: str = "info") -> None:
    """Send every record to stderr tagged with ``role``; replace old handlers.

    Args:
        role: the process's name in logs, e.g. ``master`` or ``model[simple#0]``.
        level: debug, info, warning or error (or APPLIANCE_LOG_LEVEL overrides).
    """
    level = os.environ.get("APPLIANCE_LOG_LEVEL", level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_RoleFilter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
