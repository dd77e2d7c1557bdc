#!/usr/bin/env bash
# A fleet on one machine, to try the balancer, draining and rolling upgrades
# before a real one: two appliance hosts serving the demo models, each with
# its own ports and run dir, and HAProxy in front of them.
#
#   deploy/local-fleet.sh start     # balancer on 8000 (HTTP), 8001 (gRPC), 8002 (MIP)
#   deploy/local-fleet.sh status    # each host's pid, readiness and requests in flight
#   deploy/local-fleet.sh stop      # drains and stops the hosts, then HAProxy
#
# FLEET_DIR (/tmp/appliance-fleet-<uid>) holds each host's config.toml, run
# dir and appliance.log under h0/, h1/, ..., and haproxy.cfg. FLEET_PORTS is
# the balancer's HTTP:GRPC:MIP ports, then one triple per host (default
# "8000:8001:8002 18000:18001:18002 28000:28001:28002": two hosts).
# APPLIANCE is the command that serves (default: this checkout's .venv, as
# `make run` installs it, else `appliance` on PATH). Each host's config is
# appliance/default.toml with only its ports and run dir changed; edit one
# and `appliance ctl --config FLEET_DIR/h0/config.toml reload` applies it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
FLEET_DIR=${FLEET_DIR:-/tmp/appliance-fleet-$(id -u)}
FLEET_PORTS=${FLEET_PORTS:-8000:8001:8002 18000:18001:18002 28000:28001:28002}
if [ -z "${APPLIANCE:-}" ]; then
    APPLIANCE=appliance
    [ -x "$root/.venv/bin/appliance" ] && APPLIANCE=$root/.venv/bin/appliance
fi
CTL=${CTL:-$APPLIANCE}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-120}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-120}
. "$root/deploy/lib.sh"

read -r -a triples <<<"$FLEET_PORTS"
balancer=${triples[0]}
hosts=("${triples[@]:1}")

configs() {  # each host's config path, in order
    local i
    for i in "${!hosts[@]}"; do echo "$FLEET_DIR/h$i/config.toml"; done
}

write_config() {  # write_config DIR HTTP:GRPC:MIP: default.toml with these ports and run dir
    python3 - "$root/appliance/default.toml" "$1" "$2" <<'PY'
import re
import sys
from pathlib import Path

base, host_dir, ports = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(":")
text = base.read_text()
# Each edit names the one line of default.toml it changes; a default.toml
# that no longer has that line stops the script instead of serving a config
# that collides with the other hosts.
edits = [
    (r'^run_dir = ""', f'run_dir = "{host_dir / "run"}"'),
    (r"^(\[http\]\nport = )8000", rf"\g<1>{ports[0]}"),
    (r"^(\[grpc\]\nport = )8001", rf"\g<1>{ports[1]}"),
    (r"^(listeners = \[\{ port = )8002", rf"\g<1>{ports[2]}"),
]
for pattern, replacement in edits:
    text, n = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if n != 1:
        sys.exit(f"{base}: expected one line matching {pattern!r}, found {n}")
# Every repository of the demos, relative to default.toml's directory: made absolute.
text, n = re.subn(r'^path = "(demos/[^"]+)"', rf'path = "{base.parent}/\1"', text, flags=re.MULTILINE)
if n == 0:
    sys.exit(f"{base}: expected the demos' repositories (path = \"demos/...\"), found none")
host_dir.mkdir(parents=True, exist_ok=True)
(host_dir / "config.toml").write_text(text)
PY
}

start() {
    command -v haproxy >/dev/null || { echo "haproxy is not installed (Debian: apt-get install haproxy)" >&2; exit 1; }
    mkdir -p "$FLEET_DIR"
    local i addrs=()
    for i in "${!hosts[@]}"; do
        write_config "$FLEET_DIR/h$i" "${hosts[$i]}"
        addrs+=("127.0.0.1:${hosts[$i]}")
    done
    IFS=: read -r http grpc mip <<<"$balancer"
    python3 "$root/deploy/haproxy/haproxy_config.py" --bind 127.0.0.1 \
        --http "$http" --grpc "$grpc" --mip "$mip" "${addrs[@]}" >"$FLEET_DIR/haproxy.cfg"
    for config in $(configs); do
        if [ -n "$(running_pid "$config")" ]; then
            echo "$config: already running"
            continue
        fi
        echo "starting $config"
        start_host "$config"
    done
    if ! [ -s "$FLEET_DIR/haproxy.pid" ] || ! kill -0 "$(cat "$FLEET_DIR/haproxy.pid")" 2>/dev/null; then
        haproxy -D -f "$FLEET_DIR/haproxy.cfg" -p "$FLEET_DIR/haproxy.pid"
    fi
    echo "fleet of ${#hosts[@]} hosts behind HAProxy: HTTP 127.0.0.1:$http, gRPC :$grpc, MIP :$mip"
    status
}

status() {
    local config
    for config in $(configs); do
        echo "$config: pid $(field "$config" pid), online $(field "$config" online), ready $(field "$config" ready), in flight $(field "$config" in_flight)"
    done
}

stop() {
    local config
    for config in $(configs); do
        echo "stopping $config"
        stop_host "$config"
    done
    if [ -s "$FLEET_DIR/haproxy.pid" ]; then
        kill "$(cat "$FLEET_DIR/haproxy.pid")" 2>/dev/null || true
        rm -f "$FLEET_DIR/haproxy.pid"
    fi
    echo "stopped; logs stay in $FLEET_DIR"
}

case "${1:-}" in
    start | status | stop) "$1" ;;
    *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
