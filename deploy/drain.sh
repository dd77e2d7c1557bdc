#!/usr/bin/env bash
# Take one appliance host out of rotation and wait until the balancer has
# drained it: offline (readiness fails, requests are still served), wait
# BALANCER_WAIT_S for the balancer to notice, then until nothing is in flight.
# The host keeps running; stop it afterwards (ctl stop, SIGTERM).
#
#   deploy/drain.sh /etc/appliance/config.toml
#
# Used by deploy/rolling.sh before each host's restart and by the Kubernetes
# Deployment's preStop hook (deploy/kubernetes/deployment.yaml). CTL is the
# command that talks to the host (default: appliance); DRAIN_TIMEOUT_S the
# longest wait for requests in flight; exits 1 if they do not finish.
set -euo pipefail

CTL=${CTL:-appliance}
BALANCER_WAIT_S=${BALANCER_WAIT_S:-1}
DRAIN_TIMEOUT_S=${DRAIN_TIMEOUT_S:-120}
config=$1

in_flight() {  # the host's requests in flight, from `ctl status --json`
    $CTL ctl --config "$config" --json status 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin).get("in_flight"))' 2>/dev/null || true
}

$CTL ctl --config "$config" offline
sleep "$BALANCER_WAIT_S"
deadline=$((SECONDS + DRAIN_TIMEOUT_S))
until [ "$(in_flight)" = 0 ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "$config: requests still in flight after ${DRAIN_TIMEOUT_S} s" >&2
        exit 1
    fi
    sleep 0.1
done
