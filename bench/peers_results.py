"""bench_peers.py's end: medians, targets, tables on the console, the results file,
the plot, and the tables of the performance page."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import Any

from bench import doc_http, doc_tables, report, servers, targets, thread_tables
from bench.loadgen import machine, write_results
from bench.plan import SCALING_SPLIT_CPUS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = doc_tables.PAGE


def finish(args: argparse.Namespace, record: dict[str, Any]) -> None:
    summary = report.summarise(record["rows"])
    paced_rows = report.grouped_medians(record["paced"], ("system",))
    batching_rows = report.grouped_medians(record["batching"], ("system", "payload"))
    scaling_rows = report.grouped_medians(
        record["scaling"], ("instances", "frontends", "concurrency", "system", "payload")
    )
    loop_rows = report.grouped_medians(
        record["event_loops"], ("event_loop", "system", "concurrency")
    )
    hop_rows = report.grouped_medians(record.get("hop_floor", []), ("transport", "inflight"))
    ratios = report.peer_ratios(summary)
    reached = targets.targets(summary, paced_rows, batching_rows)
    reached += targets.scaling_targets(scaling_rows)
    report.print_grid(summary)
    print("\n" + "\n".join(doc_http.http_tables(summary)))
    print("\n" + "\n".join(doc_tables.event_loop_table(loop_rows)))
    doc_tables.print_extras(
        ratios, paced_rows, batching_rows, scaling_rows, record.get("scaling_note", "")
    )
    print("\nCPU per request, thread by thread (bench/threads.py):")
    print("\n".join(thread_tables.peers_tables(summary, hop_rows)))
    report.print_targets(reached)
    name = "peers-scaling" if args.scaling_only else "peers-quick" if args.quick else "peers"
    cpus = len(os.sched_getaffinity(0))
    tag = doc_tables.TAG
    if cpus >= SCALING_SPLIT_CPUS:  # a many-core host's results sit beside this machine's
        name += f"-{cpus}core"
        tag += f"-{cpus}core"
    results = RESULTS / f"{name}.json"
    write_results(
        results,
        **record,
        summary=summary,
        ratios=ratios,
        paced_summary=paced_rows,
        batching_summary=batching_rows,
        scaling_summary=scaling_rows,
        event_loop_summary=loop_rows,
        hop_floor_summary=hop_rows,
        targets=reached,
    )
    print(f"\nwrote {results.relative_to(ROOT)}")
    if args.scaling_only:
        if cpus >= SCALING_SPLIT_CPUS:
            text = doc_tables.render_scaling(record | {"machine": machine()}, scaling_rows, reached)
            if doc_tables.update(PAGE, text, tag):
                print(f"updated the {tag} table in {PAGE.relative_to(ROOT)}")
        return
    plot(results, RESULTS / f"{name}.png")
    if doc_tables.update(PAGE, doc_http.http_section(record, summary), f"{tag}-http"):
        print(f"updated the {tag}-http tables in {PAGE.relative_to(ROOT)}")
    if not args.quick:
        text = doc_tables.render(
            record, summary, ratios, batching_rows, scaling_rows, reached, loop_rows, hop_rows
        )
        if doc_tables.update(PAGE, text, tag):
            print(f"updated the {tag} table in {PAGE.relative_to(ROOT)}")


def plot(results: Path, png: Path) -> None:
    """Draw latency against throughput with matplotlib from its bench-only venv."""
    try:
        python = servers.plot_python()
    except servers.PeerUnavailable as error:
        print(f"no plot: {error}")
        return
    script = ROOT / "bench" / "peers" / "plot.py"
    done = subprocess.run([str(python), str(script), str(results), str(png)], check=False)
    if done.returncode == 0:
        print(f"wrote {png.relative_to(ROOT)}")
