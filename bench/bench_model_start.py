"""Every appliance row of bench_peers, before and after issue 39, in one run.

``before``: model workers started with a fresh exec and a 32 MiB response ring
each (a model's own ``response_ring_bytes``, identity's 128 MiB, kept), as the
appliance was; ``after``: the defaults now, workers forked from the zygote and
rings sized to the model. Both appliances serve bench_peers' models with its
sections (bench/plan.py) side by side, over every appliance cell of
bench_peers' sweep, through bench/ab.py (the order alternating between
repeats; per cell the medians of each and the after/before ratios). Usage::

    python bench/bench_model_start.py [--quick] [--seconds S] [--repeats R]

Results: bench/results/model-start.json (model-start-quick.json with --quick)
and bench/results/model-start.md.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ab import Grid, Side, compare, grid_of  # noqa: E402
from bench.plan import FULL_SWEEP, QUICK_SWEEP, appliance_models, appliance_sections  # noqa: E402

MiB = 1 << 20


def before() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Workers started with a fresh exec, 32 MiB response rings (as the appliance was)."""
    models, sections = appliance_models(), copy.deepcopy(appliance_sections())
    sections["server"]["model_start"] = "exec"
    for model in models:
        model.setdefault("response_ring_bytes", 32 * MiB)
    return models, sections


def after() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return appliance_models(), copy.deepcopy(appliance_sections())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bench_peers' quick sweep, once")
    parser.add_argument("--seconds", type=float, help="per measurement (1.0; quick 0.5)")
    parser.add_argument("--repeats", type=int, help="repeats of the grid (3; quick 1)")
    args = parser.parse_args()
    seconds = args.seconds or (0.5 if args.quick else 1.0)
    repeats = args.repeats or (1 if args.quick else 3)
    cells = grid_of(QUICK_SWEEP if args.quick else FULL_SWEEP)
    name = "model-start-quick" if args.quick else "model-start"
    sides = (Side("before", before), Side("after", after))
    print(compare(sides, Grid(cells, seconds, repeats), name, {"args": vars(args)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
