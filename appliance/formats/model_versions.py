"""A model's version policy: which of its version directories serve.

The policy ("latest", "all", or a list of version numbers) comes from the
config's ``[[repositories]]`` or from a model's own config.toml or
config.pbtxt; :func:`parse_versions` checks it wherever it is written, and
:func:`select_versions` applies it to a model directory. Apart from the scan
(repository.py) because a model directory's settings (model_settings.py)
check a policy too.
"""

from __future__ import annotations

from pathlib import Path

from appliance.config.settings import VersionPolicy
from appliance.formats.repository_layout import MODEL_FILES, RepositoryError


def parse_versions(raw: object) -> VersionPolicy:
    """Check a version policy: "latest", "all", or a list of version numbers.

    Raises:
        RepositoryError: anything else.
    """
    if raw in ("latest", "all"):
        assert isinstance(raw, str)
        return raw
    if (
        isinstance(raw, list | tuple)
        and raw
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw)
    ):
        return tuple(sorted(set(raw)))
    raise RepositoryError(
        f'expected "latest", "all" or a non-empty list of version numbers, got {raw!r}'
    )


def select_versions(model_dir: Path, policy: VersionPolicy) -> list[int]:
    """Return the versions the policy serves, oldest first.

    Raises:
        RepositoryError: there is no version, or a listed one is missing.
    """
    present = sorted(
        int(child.name) for child in model_dir.iterdir() if child.name.isdigit() and child.is_dir()
    )
    if not present:
        raise RepositoryError(
            f"{model_dir.name}/ has no version directory (such as {model_dir.name}/1/) "
            f"holding {' or '.join(MODEL_FILES)}"
        )
    if policy == "latest":
        return present[-1:]
    if policy == "all":
        return present
    missing = [v for v in policy if v not in present]
    if missing:
        raise RepositoryError(
            f"the version policy asks for version(s) {', '.join(map(str, missing))} of "
            f"{model_dir.name}, but it has {', '.join(map(str, present))}"
        )
    return [v for v in present if v in policy]
