"""A model shipped inline in a load request: its files checked, then written for the master.

Triton's ``load_model(name, config=..., files={"1/model.onnx": ...})`` sends
a whole model directory in the request. The frontend that receives it checks
every path (relative, no ``.``/``..``/empty component, none longer than a
file name may be, no NUL) before anything is written, then writes the files
into a fresh ``<tree>/inline/<random>/<model>/`` and hands that directory to
the master, which serves the model from it and removes it once it no longer
serves from it (see ``Supervisor.load_model``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

from appliance.core.tree import Tree
from appliance.errors import BadRequest

NAME_MAX = 255  # bytes in one path component (Linux)
SHOWN = 64  # characters of an offending path a message quotes
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")
# The one path problem that is the file system's refusal rather than the path's shape.
TOO_LONG = f"a component is longer than {NAME_MAX} bytes"


def path_problem(path: str) -> str:
    """Return why ``path`` cannot be a file of a model directory, "" when it can."""
    parts = path.split("/")
    if "\0" in path:
        return "it holds a NUL byte"
    if path.startswith("/"):
        return "it is absolute"
    if any(part in ("", ".", "..") for part in parts):
        return "it has an empty, '.' or '..' component"
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in parts):
        return TOO_LONG
    return ""


def shown(path: str) -> str:
    """Quote ``path`` for a message, cut to :data:`SHOWN` characters."""
    return repr(path[:SHOWN]) + ("..." if len(path) > SHOWN else "")


def check(model: str, files: Mapping[str, bytes]) -> None:
    """Refuse a model name or file path no model directory could hold.

    Raises:
        BadRequest: the first bad one, named (cut when long) with why.
    """
    if not _MODEL_NAME.match(model) or model in (".", ".."):
        raise BadRequest(
            f"failed to load {shown(model)}: a model shipped inline needs a name of 1-63 "
            "letters, digits, '_', '.' or '-'"
        )
    if not files:
        raise BadRequest(f"failed to load '{model}': no model files were given")
    for path in files:
        problem = path_problem(path)
        if problem:
            raise BadRequest(
                f"failed to load '{model}': Invalid file path {shown(path)}: {problem}"
            )


def write(tree: Tree, model: str, files: Mapping[str, bytes]) -> Path:
    """Check ``files`` (path -> content), write them into a fresh model directory; return it.

    Raises:
        BadRequest: a bad name or path (nothing is written), or two paths that
            collide (a file where another needs a directory).
        OSError: the disk refused (what was written is removed).
    """
    check(model, files)
    top = tree.inline_dir / secrets.token_hex(8)
    directory = top / model
    tree.inline_dir.mkdir(mode=0o700, exist_ok=True)
    top.mkdir(mode=0o700)
    try:
        directory.mkdir(mode=0o700)
        for path, content in files.items():
            target = directory / path
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with open(fd, "wb") as stream:
                stream.write(content)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        remove(directory)
        raise BadRequest(
            f"failed to load '{model}': Invalid file path: the files' paths collide "
            "(one names a file where another needs a directory)"
        ) from None
    except BaseException:
        remove(directory)
        raise
    return directory


def remove(directory: Path) -> None:
    """Remove a directory :func:`write` made, with the random one above it."""
    with contextlib.suppress(OSError):
        shutil.rmtree(directory.parent)
