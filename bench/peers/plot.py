"""Latency against throughput from bench_peers.py's results, one panel per protocol family.

Runs in bench/.peers/plot (matplotlib), never in the appliance's
environment. Rows of panels are payloads; in each panel the appliance's
protocols are solid lines and the peers dashed, one point per concurrency
(1, 4, 16, 64 clients). Usage::

    python plot.py RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FAMILIES = {
    "gRPC": (
        "kserve-grpc",
        "kserve-shm",
        "grps-grpc",
        "mlserver-pw1 grpc",
        "mlserver-pw0 grpc",
        "floor-grpc-aio",
        "floor-grpc-sync",
    ),
    "HTTP": (
        "kserve-rest",
        "kserve-rest-json",
        "grps-rest",
        "graphpipe",
        "mlserver-pw1 rest-json",
        "mlserver-pw0 rest-json",
        "floor-asgi",
        "floor-gthread",
        "floor-sync",
    ),
    "UM-Bridge and MIP": ("umbridge", "umbridge-ref", "mip"),
}
PAYLOADS = ("16B", "16KiB", "1MiB", "16MiB", "digits")
PEER_PREFIXES = ("mlserver", "umbridge-ref", "floor")


def main() -> None:
    results, out = sys.argv[1], sys.argv[2]
    with open(results) as file:
        summary = json.load(file)["summary"]
    payloads = [p for p in PAYLOADS if any(p in by_payload for by_payload in summary.values())]
    fig, axes = plt.subplots(
        len(payloads),
        len(FAMILIES),
        figsize=(6 * len(FAMILIES), 3.6 * len(payloads)),
        squeeze=False,
    )
    for row, payload in enumerate(payloads):
        for col, (family, systems) in enumerate(FAMILIES.items()):
            draw(axes[row][col], summary, payload, systems)
            axes[row][col].set_title(f"{family}, {payload}", fontsize=10)
    fig.suptitle(
        "p50 latency against throughput (closed loop, 1/4/16/64 clients; "
        "solid: appliance, dashed: peers; 2 vCPUs shared with the load generator)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80)


def draw(axis, summary: dict, payload: str, systems: tuple[str, ...]) -> None:
    drawn = False
    for system in systems:
        levels = summary.get(system, {}).get(payload, {})
        points = sorted(
            (int(c), row["rps"], row["p50_ms"]) for c, row in levels.items() if row["requests"]
        )
        if not points:
            continue
        peer = system.startswith(PEER_PREFIXES)
        axis.plot(
            [p[1] for p in points],
            [p[2] for p in points],
            linestyle="--" if peer else "-",
            marker="s" if peer else "o",
            markersize=4,
            label=system,
        )
        drawn = True
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("requests/s")
    axis.set_ylabel("p50 ms")
    axis.grid(True, which="both", alpha=0.3)
    if drawn:
        axis.legend(fontsize=7)


if __name__ == "__main__":
    main()
