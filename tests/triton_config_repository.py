"""tests/data/triton_config_models, copied out for a server to serve.

The models that only differ by their config.pbtxt (queued, expiring,
rejecting, prioritized) keep one model.py, queued's: the copy gives each its
own, as a Triton repository needs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "data" / "triton_config_models"
SAME_AS_QUEUED = ("expiring", "rejecting", "prioritized")


def copy_to(root: Path) -> Path:
    """Copy the repository into ``root``; return it."""
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    (root / "README.md").unlink()
    for name in SAME_AS_QUEUED:
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "queued" / "1" / "model.py", root / name / "1" / "model.py")
    return root
