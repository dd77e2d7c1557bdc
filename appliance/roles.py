"""What a child process runs: ``appliance child <role> ...``, the master's way to start one.

The master starts each child as a fresh interpreter with this command line,
or has the zygote fork one that runs the same (a model worker); either way
the role's own ``run`` takes it from here. The zygote itself is started the
first way, and cli.py runs it (it forks children that come here). Not meant
to be typed by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROLES = ("model", "http", "grpc", "mip", "zygote")


def main(argv: list[str]) -> int:
    """Run the role ``argv`` names (the arguments after ``appliance child``)."""
    parser = argparse.ArgumentParser(prog="appliance child")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(child: argparse.ArgumentParser) -> None:
    """The arguments of ``appliance child``."""
    child.add_argument("role", choices=ROLES)
    child.add_argument("--tree-dir", type=Path, required=True)
    child.add_argument("--master-pid", type=int, required=True)
    child.add_argument("--slot", type=int, required=True)
    child.add_argument("--generation", type=int, required=True)
    child.add_argument("--model", default="")
    child.add_argument("--snapshot", type=Path, help="model: the config snapshot to load")
    child.add_argument("--port", type=int, default=0)
    child.add_argument(
        "--listen-fd", type=int, help="HTTP and gRPC: the inherited listening socket"
    )
    child.add_argument("--listen-fds", default="", help="MIP: the listeners' sockets, fd,...")
    child.add_argument("--metrics-port", type=int, help="HTTP: the port of /metrics alone")
    child.add_argument("--metrics-fd", type=int, help="HTTP: that port's inherited socket")
    child.add_argument("--management-port", type=int, help="HTTP: the management API's port")
    child.add_argument(
        "--management-fd", type=int, help="HTTP, gRPC: the management port's inherited socket"
    )
    child.add_argument("--worker-slots", default="0:0")
    child.add_argument("--index", type=int, default=0)
    child.add_argument("--listeners", default="", help="MIP: port=model,...")
    child.add_argument("--socket-fd", type=int, help="zygote: its socket to the master")


def run(args: argparse.Namespace) -> int:
    """Run a child of the role ``args`` names (any but the zygote), until it stops; its
    exit status."""
    common = (args.tree_dir, args.master_pid, args.slot)
    if args.role == "model":
        from appliance.worker import main as worker

        return worker.run(*common, args.generation, args.model, args.snapshot)
    if args.role == "http":
        from appliance.frontends import http

        metrics = (args.metrics_port, args.metrics_fd) if args.metrics_fd is not None else None
        management = None
        if args.management_fd is not None:
            management = (args.management_port, args.management_fd)
        return http.run(*common, args.port, args.listen_fd, args.worker_slots, metrics, management)
    if args.role == "grpc":
        from appliance.frontends import grpc

        return grpc.run(*common, args.listen_fd, args.index, args.management_fd)
    from appliance.config.listeners import parse_fds
    from appliance.frontends import mip

    listeners = mip.parse_listeners(args.listeners)
    return mip.run(*common, listeners, parse_fds(args.listen_fds), args.index)
