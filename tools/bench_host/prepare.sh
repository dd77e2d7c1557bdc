#!/usr/bin/env bash
# Gather into .wh/ the wheels the bench host lacks, on a machine with a package index.
#
# The 16-core bench host has Python 3.12 in /opt/torch/.venv with torch (CUDA),
# onnxruntime, numpy, grpcio, matplotlib and more, and no network. Its run
# (tools/bench_host/run.sh) installs the appliance, its test and benchmark
# clients and the benchmark's peers from these wheels only. The device tool
# carries .wh/ with the checkout when a call names it in `carry`; the checkout
# and the carried folders must stay under 64 MiB, so the big wheels the host is
# known to have are left out (DROP).
#
#   bash tools/bench_host/prepare.sh          # then: run ... carry [".wh"]
#   WHEEL_PYTHON=/path/to/python3.12 bash tools/bench_host/prepare.sh  # one not on PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}
DROP=${DROP:-numpy pandas torch}

# The appliance's own dependencies, read from pyproject.toml (one list, not two).
mapfile -t deps < <("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# The test and benchmark clients run.sh installs beside it (it reads them
# from .wh/clients.txt), and what the build and the benchmark's peers need.
clients=(pytest pytest-timeout "tritonclient[http,grpc]==2.73.0" umbridge==1.2.10 kubemo==0.0.dev2 tomli-w requests)
extra=(setuptools wheel)
# MLServer's venv pins an older uvloop than the appliance's: downloaded on
# their own, so both versions are there and neither resolution holds the other.
mlserver=("mlserver==1.7.1" "uvloop==0.21.0")

rm -rf .wh
mkdir .wh
"$PY" -m pip download --quiet --only-binary=:all: --python-version "$PY_VERSION" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d .wh "${deps[@]}" "${clients[@]}" "${extra[@]}"
"$PY" -m pip download --quiet --only-binary=:all: --python-version "$PY_VERSION" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d .wh "${mlserver[@]}"
printf '%s\n' "${clients[@]}" > .wh/clients.txt
# gunicorn's C parser, for the benchmark's gunicorn-ASGI floor (the HTTP stack
# the appliance had before uvicorn's worker, bench/servers.py): published as
# source only, built here into a wheel for the host's Python when this machine
# has that version and a C compiler (else that floor parses in Python).
WHEEL_PYTHON=${WHEEL_PYTHON:-python$PY_VERSION}
if "$WHEEL_PYTHON" -c '' 2> /dev/null; then
    "$WHEEL_PYTHON" -m pip wheel --quiet --no-deps -w .wh "gunicorn-h1c>=0.6.10" ||
        echo "no wheel of gunicorn-h1c for Python $PY_VERSION: the gunicorn-ASGI floor parses in Python"
fi
# GraphPipe's client pins versions that break; it goes in without them (as in the Makefile).
"$PY" -m pip download --quiet --no-deps -d .wh graphpipe==1.0.4
# Triton's CUDA shared-memory example clients, for test_cuda_shm.py there
# (the Triton client mirror is not reachable from the host).
MIRROR=${TRITON_CLIENT_REPO:-/work/.mirror/triton-inference-server+client/repo}
if [ -d "$MIRROR" ]; then
    mkdir .wh/triton-examples
    for example in simple_grpc_cudashm_client.py simple_http_cudashm_client.py; do
        git -C "$MIRROR" show "HEAD:src/python/examples/$example" > .wh/triton-examples/$example
    done
fi
for name in $DROP; do
    rm -f .wh/"$name"-*.whl
done
echo "wheels for Python $PY_VERSION in .wh/: $(ls .wh | wc -l) files, $(du -sh .wh | cut -f1) (left out: $DROP)"
