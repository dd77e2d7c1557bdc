#!/usr/bin/env bash
# Run phases of the benchmark and the GPU tests on the 16-core bench host.
#
# The host: 16 CPU cores, one H100, Python 3.12 in /opt/torch/.venv (torch with
# CUDA, onnxruntime, numpy, grpcio, ...), no network. Each device call runs in
# a fresh copy of the checkout; a warm machine keeps ignored folders (.venv,
# bench/.peers) between calls, a fresh one starts bare. So every phase first
# makes the environment if it is missing, offline, from .wh/ (prepare.sh):
# .venv is a venv of the host's Python that sees /opt/torch/.venv's packages
# through a .pth file (a venv of a venv does not see them otherwise), and the
# benchmark's peers get the same (BENCH_BASE_SITE, bench/servers.py).
#
# From the development machine, one device call per phase or two (each call
# has at most 10 minutes; logs and results come back under $OUT, at most 8
# files). Times seen on the H100 host (2026-11-25): setup 30 s, gpu 2.5 min (2026-11-26),
# scaling 9.5 min for the whole grid (4.5 min for BENCH_SCALING_GRID=1x1,4x1,1x8,4x8),
# the load grid of `full` 7 min per repeat, so `full` does not fit one call:
#
#   bash tools/bench_host/prepare.sh
#   run: bash tools/bench_host/run.sh gpu peers      carry: [".wh"]   (about 7 min)
#   run: SCALING_BOUND_S=560 bash tools/bench_host/run.sh scaling
#                                                    carry: [".wh"]   (the 16-core table)
#
# A device session has 30 minutes in all: issue the next call within 30 s of
# the last one's return and the machine stays warm (no new start, no setup).
#
# Phases: setup (only the environment), gpu (test_gpu.py, test_cuda_shm.py,
# test_kserve_shm.py and bench/bench_gpu.py), peers (bench_peers --quick
# --no-scaling), scaling (bench_peers --scaling-only, SCALING_BOUND_S, default
# 520 s; BENCH_SCALING_GRID picks a smaller grid), full (bench_peers, bounded).
# A phase stopped at its bound still writes what it measured (cut_short).
# Then commit what came back: bench/results/*-16core.json, gpu.json, and
# performance.md as docs/performance.md (the benchmarks write their tables there).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BASE=${BASE_PYTHON:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.wh" PIP_DISABLE_PIP_VERSION_CHECK=1
BENCH_BASE_SITE=$("$BASE" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export BENCH_BASE_SITE
PY=$ROOT/.venv/bin/python
PAGE_BEFORE=$(cksum < docs/performance.md)
failed=0

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

setup() {
    if [ -f .venv/.bench-host ]; then
        return 0
    fi
    log "setup: .venv from $BASE, offline from .wh"
    rm -rf .venv
    "$BASE" -m venv .venv || return 1
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$BENCH_BASE_SITE" > "$site/_base.pth"
    "$PY" -m pip install -q "setuptools>=77" wheel || return 1
    "$PY" -m pip install -q --no-build-isolation -e . -r .wh/clients.txt || return 1
    "$PY" -m pip install -q --no-deps graphpipe==1.0.4 || return 1
    touch .venv/.bench-host
}

# What the results were measured on, with every call's results.
describe_host() {
    "$PY" - <<'PYTHON' > "$OUT/host.txt" 2>&1
import os, platform, sys
import numpy, grpc, zmq
print(f"host: {platform.node()}, {len(os.sched_getaffinity(0))} CPUs, Python {sys.version.split()[0]}")
print(f"numpy {numpy.__version__}, grpcio {grpc.__version__}, pyzmq {zmq.__version__}")
try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no usable GPU"
    print(f"torch {torch.__version__}: {gpu}")
except ImportError:
    print("torch: not importable")
PYTHON
}

# Run a command with its output in $OUT/NAME.log; a failure is noted, not fatal.
step() {
    local name=$1
    shift
    log "$name: $*"
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    log "$name: exit $rc (last lines below)"
    tail -n 15 "$OUT/$name.log" | tee -a "$OUT/run.log"
    [ "$rc" -eq 0 ] || failed=1
}

collect() {
    cp bench/results/*core*.json bench/results/*core*.png bench/results/gpu.json "$OUT"/ 2>/dev/null
    [ "$(cksum < docs/performance.md)" = "$PAGE_BEFORE" ] || cp docs/performance.md "$OUT"/performance.md
    # One file for the peers' logs: a device call returns at most 8 files.
    if compgen -G "bench/.peers/*.log" > /dev/null; then
        tar -C bench/.peers -czf "$OUT/peer-logs.tgz" $(cd bench/.peers && ls *.log)
    fi
    return 0
}

if ! setup > "$OUT/setup.log" 2>&1; then
    log "setup failed:"
    tail -n 30 "$OUT/setup.log" | tee -a "$OUT/run.log"
    exit 1
fi
describe_host
cat "$OUT/host.txt" >> "$OUT/run.log"
for phase in "$@"; do
    case $phase in
        setup) ;;
        gpu)
            step gpu-tests env TRITON_EXAMPLES_DIR="$ROOT/.wh/triton-examples" \
                "$PY" -m pytest -q -p no:cacheprovider -rs tests/system/test_gpu.py \
                tests/system/test_cuda_shm.py tests/system/test_kserve_shm.py
            step bench-gpu "$PY" bench/bench_gpu.py
            ;;
        peers) step peers "$PY" bench/bench_peers.py --quick --no-scaling ;;
        # SIGTERM at the bound: bench_peers writes what it measured (cut_short).
        scaling) step scaling timeout --foreground -k 30 "${SCALING_BOUND_S:-520}" "$PY" bench/bench_peers.py --scaling-only \
            --seconds "${SCALING_SECONDS:-0.5}" ;;
        full) step full timeout --foreground -k 30 520 "$PY" bench/bench_peers.py --budget-min 8 ;;
        *)
            log "unknown phase $phase (setup gpu peers scaling full)"
            failed=1
            ;;
    esac
    collect
done
log "done; results and logs in $OUT"
exit "$failed"
