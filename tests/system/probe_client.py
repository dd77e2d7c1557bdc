"""A client process for tests: send BatchProbe requests, check every answer.

Usage: ``python -m tests.system.probe_client RUN_DIR COUNT SEED`` prints a
JSON summary: requests answered correctly, and the largest batch any of
them rode in.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

from appliance.client.api import ModelClient


def main() -> int:
    run_dir, count, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    client = ModelClient.connect(run_dir)
    rng = np.random.default_rng(seed)
    requests = [rng.random((int(rng.integers(1, 5)), 4), dtype=np.float32) for _ in range(count)]

    def one(x: np.ndarray) -> int:
        with client.infer("probe", {"x": x}) as result:
            if not np.array_equal(result.array("y"), 2 * x):
                raise AssertionError("wrong output rows for this request")
            return int(result.array("batch")[0, 0])

    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(one, requests))
    client.close()
    sys.stdout.write(orjson.dumps({"ok": len(batches), "max_batch": max(batches)}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
