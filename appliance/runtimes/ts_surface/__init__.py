"""The ``ts`` package TorchServe's handlers import, as the appliance provides it.

A handler written for TorchServe imports ``ts.torch_handler.base_handler``,
``ts.context``, ``ts.handler_utils.utils`` or ``ts.metrics``. Where TorchServe
itself is not installed, the TorchServe runtime puts this folder on
``sys.path`` (:func:`ensure_ts`), so that ``import ts`` finds the package
below; where it is, TorchServe's own classes are used as they are. Inside
the package, modules import each other relatively, so that it reads the same
under either name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def ensure_ts() -> bool:
    """Make ``import ts`` work; True when it is TorchServe's own package."""
    if HERE in sys.path:
        return False
    if importlib.util.find_spec("ts") is not None:
        return True
    sys.path.append(HERE)
    return False
