"""The command line: ``serve``, ``ctl <command>``, and the internal ``child``.

``appliance child <role>`` is how the master starts its children; it is not
meant to be typed by hand.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import tomllib
from pathlib import Path

import orjson

from appliance import roles
from appliance.config.reader import from_dict, load
from appliance.config.settings import DEFAULT_CONFIG, ConfigError
from appliance.core.tree import Tree
from appliance.formats import command_line as triton_flags
from appliance.formats.torchserve import keys as torchserve_keys
from appliance.observability import logs

log = logging.getLogger("appliance")


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["serve"] and any(
        arg.split("=")[0] in triton_flags.SERVE_FLAGS for arg in given[1:]
    ):
        return _serve_repositories(given[1:])
    parser = _parser()
    args = parser.parse_args(given)
    if args.command is None:
        parser.print_help()
        return 2
    handler = {"serve": _serve, "shm-size": _shm_size, "ctl": _ctl, "child": _child}[args.command]
    return handler(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance", description="A multiprocess, shared-memory model server."
    )
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser(
        "serve",
        help="serve the configured models in the foreground",
        description="Serve a config's models, or Triton model repositories as tritonserver "
        "would: appliance serve --model-repository DIR [tritonserver flags].",
        epilog=triton_flags.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", type=Path, help="TOML config (default: the demo config)")
    serve.add_argument(
        "--model-repository",
        metavar="DIR",
        help="serve this Triton model repository with no config (repeatable; with the "
        "tritonserver flags below)",
    )

    shm_size = commands.add_parser(
        "shm-size",
        help="how large /dev/shm should be for a config (a container's --shm-size)",
    )
    shm_size.add_argument("--config", type=Path, help="TOML config (default: the demo config)")
    shm_size.add_argument(
        "--cpus", type=int, default=0, help='the CPUs "auto" sizes for (default: this host\'s)'
    )

    ctl = commands.add_parser("ctl", help="control a running appliance")
    where = ctl.add_mutually_exclusive_group()
    where.add_argument("--socket", type=Path, help="the control socket")
    where.add_argument("--config", type=Path, help="find the control socket from this config")
    ctl.add_argument("--json", action="store_true", help="print the raw JSON reply")
    ctl.add_argument(
        "--all", action="store_true", help="status: list every process, however many models"
    )
    ctl.add_argument(
        "action", choices=["status", "online", "offline", "reload", "load", "unload", "stop"]
    )
    ctl.add_argument("model", nargs="?", help="load/unload: the model's name")

    child = commands.add_parser("child", help="(internal) how the master starts its children")
    roles.add_arguments(child)
    return parser


def _serve(args: argparse.Namespace) -> int:
    return _run(args.config)


def _serve_repositories(flags: list[str]) -> int:
    """Serve Triton repositories from tritonserver's flags (triton_flags.py).

    The config they mean goes into a file of this process's own, which a
    reload or a load reads again (so a model added to a repository is found),
    and which is removed when the appliance stops.
    """
    notes: list[str] = []
    try:
        tables = triton_flags.config(flags, notes)
    except triton_flags.FlagError as ex:
        print(f"appliance serve: {ex}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"appliance serve: {note}", file=sys.stderr)
    handle, name = tempfile.mkstemp(prefix="appliance-serve-", suffix=".toml")
    path = Path(name)
    written: torchserve_keys.Keys | None = None
    try:
        if tables.pop(triton_flags.TOKEN_AUTH, None) is not None:
            # TorchServe's token authorization: its key file where it was started.
            written = torchserve_keys.write(Path.cwd())
            tables["auth"] = {"tokens_file": str(written.key_file)}
            print(
                f"appliance serve: token authorization on: keys in {written.key_file} "
                "(--disable-token-auth turns it off)",
                file=sys.stderr,
            )
        with os.fdopen(handle, "w") as stream:
            stream.write(triton_flags.toml_text(tables))
        return _run(path)
    except OSError as ex:
        print(f"appliance serve: cannot write the key file: {ex}", file=sys.stderr)
        return 2
    finally:
        path.unlink(missing_ok=True)
        if written is not None:
            written.remove()


def _run(config_path: Path | None) -> int:
    from appliance.master.supervisor import Supervisor
    from appliance.master.tree_files import StartError

    logs.setup("master")
    try:
        config = load(config_path)
    except ConfigError as ex:
        log.error("%s", ex)
        return 2
    logs.setup("master", config.server.log_level)
    try:
        return Supervisor(config, config_path).run()
    except StartError as ex:
        log.error("cannot start: %s", ex)
        return 1


def _shm_size(args: argparse.Namespace) -> int:
    from appliance.master import shm

    try:
        if args.cpus:
            # "auto" counts as on a host (a pod's CPU limit) of that many CPUs.
            path = args.config or DEFAULT_CONFIG
            data = tomllib.loads(path.read_text())
            data.setdefault("server", {})["cpus"] = args.cpus
            config = from_dict(data, str(path), scan_repositories=True)
        else:
            config = load(args.config)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as ex:
        print(f"appliance shm-size: {ex}", file=sys.stderr)
        return 2
    print(shm.sizing_text(config))
    return 0


def _ctl(args: argparse.Namespace) -> int:
    from appliance.client.status_format import format_status
    from appliance.processes.control import ControlError, request

    try:
        path = args.socket or Tree("", load(args.config).resolved_run_dir()).control_path
        fields = {"model": args.model} if args.model else {}
        reply = request(path, args.action, **fields)
    except (ControlError, ConfigError) as ex:
        print(f"appliance ctl: {ex}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(reply, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.action == "status":
        sys.stdout.write(format_status(reply, every=args.all))
    else:
        print(_summary(args.action, reply))
    return 0


def _summary(action: str, reply: dict[str, object]) -> str:
    if action == "reload":
        parts = [
            f"{key}: {', '.join(map(str, reply[key])) or '-'}"  # type: ignore[call-overload]
            for key in ("added", "changed", "removed", "unchanged")
        ]
        ensembles = reply.get("ensembles") or {}
        assert isinstance(ensembles, dict)
        parts += [
            f"ensembles {key}: {', '.join(map(str, names))}"
            for key, names in ensembles.items()
            if names
        ]
        return "reload started; " + "; ".join(parts)
    return {
        "online": "online",
        "offline": "offline",
        "stop": "draining",
        "load": "loading",
        "unload": "unloaded",
    }[action]


def _child(args: argparse.Namespace) -> int:
    if args.role != "zygote":
        return roles.run(args)
    # Imported here: what the zygote preloads is a model worker's, not the CLI's.
    from appliance import zygote

    return zygote.run(args.tree_dir, args.master_pid, args.slot, args.socket_fd)
