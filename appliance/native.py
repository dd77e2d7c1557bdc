"""The request path, compiled where a C compiler is at hand.

A profile of the model worker under load (docs/performance.md, issue 55) put
two thirds of its CPU in the Python interpreter, spread thin over the
modules below; a frontend's own modules ran some 4,000 bytecodes a KServe
REST request beside uvicorn's and falcon's 2,000. ``make install`` compiles
them with mypyc (from the same sources: no second implementation) into C
extensions beside them, in one group library, ``appliance/_native__mypyc*.so``.
Where that cannot be done (no compiler, no mypy), nothing is built and the
same modules run as Python.

Compiled modules call one another directly in C, so they only run together:
when any of their sources changed after the build (an edit, a checkout), or
``APPLIANCE_PURE=1`` is set, :func:`guard` (run when the package is
imported) has every one of them loaded from its source instead, and says so
in the master's log (:func:`state`). :func:`build` (``make install``) builds,
or says why not; it does nothing when the build is up to date.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
GROUP = "appliance._native"
MANIFEST = PACKAGE / "_native.json"
PURE_ENV = "APPLIANCE_PURE"

# The request path: a model worker's, from the descriptor's arrival to the
# reply's send, and the counting; and a frontend's own part of it: the HTTP
# worker's connection, its observer and body reader, the KServe REST
# resources and request runner, the client API's call cores, drivers,
# channels, request table, calls, results and routing, the KServe codecs
# (REST JSON and protobuf), the status table, tensors and dtypes. What stays
# Python: the faces made by decorators (a compiled function kept on a class
# does not bind), async generators, subclasses of builtins and of the web
# and RPC libraries' classes, and the classes a model or a user extends.
MODULES = (
    "appliance.client.aio",
    "appliance.client.call",
    "appliance.client.call_cores",
    "appliance.client.channel",
    "appliance.client.drive",
    "appliance.client.inflight",
    "appliance.client.result",
    "appliance.client.routing",
    "appliance.core.descriptor",
    "appliance.core.dtypes",
    "appliance.core.message_tensors",
    "appliance.core.status",
    "appliance.core.tensor",
    "appliance.frontends.http11",
    "appliance.frontends.http_exchange",
    "appliance.frontends.observe_http",
    "appliance.observability.metrics",
    "appliance.protocols.bodies",
    "appliance.protocols.jsonbody",
    "appliance.protocols.kserve.codec",
    "appliance.protocols.kserve.encoding",
    "appliance.protocols.kserve.infer",
    "appliance.protocols.kserve.inference",
    "appliance.protocols.kserve.pbcodec",
    "appliance.protocols.kserve.rest",
    "appliance.protocols.kserve.service",
    "appliance.worker.batch_runner",
    "appliance.worker.batcher",
    "appliance.worker.execute",
    "appliance.worker.intake",
    "appliance.worker.mappings",
    "appliance.worker.outbox",
    "appliance.worker.own_slot",
    "appliance.worker.passthrough",
    "appliance.worker.pending",
    "appliance.worker.per_request",
    "appliance.worker.pieces",
    "appliance.worker.plain",
    "appliance.worker.refusals",
    "appliance.worker.replies",
    "appliance.worker.sequence_batcher",  # a Batcher: a compiled class's subclass is compiled
    "appliance.worker.server",
    "appliance.worker.stream_steps",
    "appliance.worker.streams",
)

# Hand-written C, built with the modules above and run only when they are: a
# copy from or into a client's mapped segment that a shrinking file cannot
# kill (appliance/core/_guarded.c); Python has no way to return from SIGBUS.
C_MODULES = ("appliance.core._guarded",)

COMPILED = "compiled (mypyc)"
_state = "pure Python (not compiled)"


def source_of(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + (".c" if module in C_MODULES else ".py"))


def state() -> str:
    """How the request path runs in this process: compiled, or pure Python and why."""
    return _state


def compiled() -> bool:
    """Whether the compiled request path (C_MODULES with it) runs in this process."""
    return _state == COMPILED


def _suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def _stamps() -> dict[str, list[int]]:
    """Each source's modification time and size: what a change of it changes."""
    out = {}
    for module in (*MODULES, *C_MODULES):
        status = source_of(module).stat()
        out[module] = [status.st_mtime_ns, status.st_size]
    return out


def _digests() -> dict[str, str]:
    return {
        m: hashlib.sha256(source_of(m).read_bytes()).hexdigest() for m in (*MODULES, *C_MODULES)
    }


def _built() -> dict[str, Any] | None:
    """The manifest of the last build, if it is of these modules and this Python."""
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("modules") != [*MODULES, *C_MODULES] or manifest.get("suffix") != _suffix():
        return None
    return dict(manifest)


def _why_pure() -> str | None:
    """Why the compiled modules must not run here (None: they may)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return f"pure Python ({PURE_ENV} is set)"
    manifest = _built()
    if manifest is None:
        return "pure Python (not compiled)"
    try:
        if manifest.get("stamps") != _stamps():
            return "pure Python (sources changed since the build; make install rebuilds it)"
    except OSError:
        return "pure Python (a source is missing)"
    if not all(_extension(m).exists() for m in (*MODULES, *C_MODULES)):
        return "pure Python (a compiled module is missing)"
    return None


def _extension(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + _suffix())


class _FromSource(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from their sources, ahead of their extensions."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in C_MODULES:
            raise ModuleNotFoundError(f"{fullname} runs only with the compiled request path")
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname))


def guard() -> None:
    """Run the compiled modules only if every one of them is current (see the module doc)."""
    global _state
    why = _why_pure()
    if why is None:
        _state = COMPILED
        return
    _state = why
    loaded = [m for m in (*MODULES, *C_MODULES) if m in sys.modules]
    if loaded:  # too late to choose; not expected: the package imports this first
        _state += f"; already loaded: {', '.join(loaded)}"
    # Where nothing is built this changes nothing; where anything is, it must not load.
    sys.meta_path.insert(0, _FromSource())


def build() -> int:
    """Compile the modules where they are, unless the build is current."""
    manifest = _built()
    digests = _digests()
    current = manifest is not None and manifest.get("digests") == digests
    if current and all(_extension(m).exists() for m in (*MODULES, *C_MODULES)):
        if manifest is not None and manifest.get("stamps") != _stamps():
            _write_manifest(digests)  # the same code, touched (a checkout): no compile
        print("appliance.native: compiled modules are current")
        return 0
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("appliance.native: no C compiler; the request path runs as pure Python")
        return 0
    missing = [name for name in ("mypyc", "setuptools") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"appliance.native: no {' or '.join(missing)}; the request path runs as pure Python")
        return 0
    remove()
    try:
        if (ROOT / "pyproject.toml").exists():
            # The source tree: the C sources and objects stay in build/ for the next build.
            _compile(ROOT, "build/native", [])
        else:
            _compile_installed()
    except (Exception, SystemExit) as ex:  # a failed compile leaves the pure path
        remove()
        print(f"appliance.native: compiling failed ({ex}); the request path runs as pure Python")
        return 0
    _write_manifest(digests)
    print(f"appliance.native: compiled {len(MODULES)} modules and {len(C_MODULES)} in C")
    return 0


def _compile(root: Path, work: str, options: list[str]) -> None:
    """Compile :data:`MODULES` of the package under ``root`` beside their sources
    (``work``: where the C sources and objects go)."""
    from mypyc.build import mypycify
    from setuptools import Extension, setup  # type: ignore[import-untyped]

    sources = [str(Path(*m.split(".")).with_suffix(".py")) for m in MODULES]
    handwritten = [
        Extension(m, [str(Path(*m.split(".")).with_suffix(".c"))], extra_compile_args=["-O2"])
        for m in C_MODULES
    ]
    previous = Path.cwd()
    os.chdir(root)
    try:
        extensions = mypycify([*options, *sources], group_name=GROUP, target_dir=work)
        setup(
            name="appliance-native",
            ext_modules=[*extensions, *handwritten],
            script_args=["--quiet", "build_ext", "--inplace", "--build-temp", work],
        )
    finally:
        os.chdir(previous)


def _compile_installed() -> None:
    """Compile an installed package (make install-systemd): in a copy of it in a
    temporary directory, the extensions then copied beside the sources.

    mypy run in site-packages would take every module there for the caller's
    own (and refuse the top-level ones its bundled stubs cover); the tree's mypy
    settings are not there either: the compiled modules' types are checked by
    ``make lint``, so here what they import is followed silently and untyped
    imports are Any.
    """
    with tempfile.TemporaryDirectory(prefix="appliance-native-") as work:
        copy = Path(work) / "src"
        ignore = shutil.ignore_patterns("__pycache__", f"*{_suffix()}", MANIFEST.name)
        shutil.copytree(PACKAGE, copy / PACKAGE.name, ignore=ignore)
        options = ["--cache-dir", f"{work}/mypy", "--ignore-missing-imports"]
        _compile(copy, f"{work}/build", [*options, "--follow-imports", "silent"])
        for built in (copy / PACKAGE.name).rglob(f"*{_suffix()}"):
            shutil.copy2(built, PACKAGE / built.relative_to(copy / PACKAGE.name))


def _write_manifest(digests: dict[str, str]) -> None:
    manifest = {
        "modules": [*MODULES, *C_MODULES],
        "suffix": _suffix(),
        "digests": digests,
        "stamps": _stamps(),
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


def remove() -> None:
    """Remove every compiled module (those of the last build too) and the manifest."""
    try:
        built = list(json.loads(MANIFEST.read_text()).get("modules", []))
    except (OSError, ValueError):
        built = []
    MANIFEST.unlink(missing_ok=True)
    for module in {*MODULES, *C_MODULES, *built}:
        _extension(str(module)).unlink(missing_ok=True)
    for library in PACKAGE.glob(f"_native__mypyc*{_suffix()}"):
        library.unlink()
