"""Write an HAProxy config for a fleet of appliance hosts.

    python deploy/haproxy/haproxy_config.py 10.0.0.1 10.0.0.2 > haproxy.cfg

Each host is ``ADDR`` (the default ports 8000/8001/8002) or
``ADDR:HTTP:GRPC:MIP``. The balancer listens on --http, --grpc and --mip.

Health checks ask the readiness probes every ``--inter-ms`` (200 ms) and take
a host out after two failed checks, so ``appliance ctl offline`` moves traffic
within about two intervals (under a second), while the host keeps serving
what is still sent during its drain grace. A slow answer is not a failure
(``timeout check 1s``): on a busy host one late check must not take it out.

- HTTP: ``GET /v2/health/ready`` must answer 200.
- gRPC: HAProxy 2.6 cannot send a gRPC health request (its checks send no
  binary HTTP/2 bodies), so the gRPC server entries are checked through the
  same host's HTTP readiness probe (``check port``): readiness is one switch
  for the whole host, so both answer together.
- MIP: a ``tcp-check`` sends a MIP ping (version 0, kind 1, subtype 0, no
  body) and expects the pong ``00 01 01 00 00000000``; an offline host
  answers a ping with an error instead.

gRPC is proxied in HTTP mode over h2 so that each call, not each connection,
is balanced: a client's long-lived channel follows hosts in and out.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

MIP_PING = "0001000000000000"
MIP_PONG = "0001010000000000"


@dataclass(frozen=True)
class Host:
    addr: str
    http: int = 8000
    grpc: int = 8001
    mip: int = 8002

    @classmethod
    def parse(cls, text: str) -> Host:
        addr, *ports = text.split(":")
        if ports and len(ports) != 3:
            raise ValueError(f"{text!r}: expected ADDR or ADDR:HTTP:GRPC:MIP")
        return cls(addr, *map(int, ports)) if ports else cls(addr)


def render(
    hosts: list[Host],
    http: int = 8000,
    grpc: int = 8001,
    mip: int = 8002,
    bind: str = "0.0.0.0",
    inter_ms: int = 200,
    log_stdout: bool = False,
) -> str:
    """The haproxy.cfg text for ``hosts``."""
    check = f"check inter {inter_ms}ms fastinter {inter_ms}ms downinter {inter_ms}ms"
    lines = [
        "global",
        "    maxconn 4096",
        *(["    log stdout format raw local0"] if log_stdout else []),
        "",
        "defaults",
        *(["    log global", "    option httplog"] if log_stdout else []),
        "    timeout connect 1s",
        "    timeout client 60s",
        "    timeout server 60s",
        # A check that a loaded host answers late is not a failure: only a
        # refused connection, a 503 or a wrong pong is.
        "    timeout check 1s",
        # A host killed or restarting refuses connections: try another one.
        "    retries 3",
        "    option redispatch 1",
        "    default-server fall 2 rise 2",
        "",
        "frontend http_in",
        "    mode http",
        f"    bind {bind}:{http}",
        "    default_backend appliance_http",
        "",
        "backend appliance_http",
        "    mode http",
        "    balance roundrobin",
        "    option httpchk GET /v2/health/ready",
        "    http-check expect status 200",
        # Retried only when nothing was sent yet or the connection was reset
        # before any reply (a host that was SIGKILLed between checks).
        "    retry-on conn-failure empty-response",
        "    option http-buffer-request",
    ]
    lines += [f"    server h{i} {h.addr}:{h.http} {check}" for i, h in enumerate(hosts)]
    lines += [
        "",
        "frontend grpc_in",
        "    mode http",
        f"    bind {bind}:{grpc} proto h2",
        "    default_backend appliance_grpc",
        "",
        "backend appliance_grpc",
        "    mode http",
        "    balance roundrobin",
        "    option httpchk GET /v2/health/ready",
        "    http-check expect status 200",
        "    retry-on conn-failure empty-response",
        "    option http-buffer-request",
    ]
    lines += [
        f"    server h{i} {h.addr}:{h.grpc} proto h2 {check}"
        f" check-proto h1 addr {h.addr} port {h.http}"
        for i, h in enumerate(hosts)
    ]
    lines += [
        "",
        "frontend mip_in",
        "    mode tcp",
        f"    bind {bind}:{mip}",
        "    default_backend appliance_mip",
        "",
        "backend appliance_mip",
        "    mode tcp",
        "    balance roundrobin",
        "    option tcp-check",
        "    tcp-check connect",
        f"    tcp-check send-binary {MIP_PING}",
        # min-recv: judge the first 8 bytes at once; an offline host's error
        # frame fails the check without waiting for the timeout.
        f"    tcp-check expect min-recv 8 binary {MIP_PONG}",
    ]
    lines += [f"    server h{i} {h.addr}:{h.mip} {check}" for i, h in enumerate(hosts)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", nargs="+", help="ADDR or ADDR:HTTP:GRPC:MIP")
    parser.add_argument("--http", type=int, default=8000, help="balancer's HTTP port")
    parser.add_argument("--grpc", type=int, default=8001, help="balancer's gRPC port")
    parser.add_argument("--mip", type=int, default=8002, help="balancer's MIP port")
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--inter-ms", type=int, default=200, help="health check interval")
    args = parser.parse_args(argv)
    hosts = [Host.parse(text) for text in args.hosts]
    sys.stdout.write(render(hosts, args.http, args.grpc, args.mip, args.bind, args.inter_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
