#!/usr/bin/env bash
# Rolling upgrade of appliance hosts behind a load balancer, one at a time:
# offline and wait until the balancer has drained it (deploy/drain.sh),
# stop (SIGTERM drain),
# start the new version, wait ready, online, wait until the balancer sends
# to it again. Stops at the first host that does not come back.
#
#   APPLIANCE=/opt/appliance-2/bin/appliance deploy/rolling.sh /etc/appliance/a.toml ...
#
# Each argument is a host's config; `appliance ctl --config` finds its
# control socket from it. APPLIANCE is the new version's command (default:
# appliance); CTL the one that talks to the running hosts (default: the same).
# BALANCER_WAIT_S is how long the balancer takes to see a readiness change
# (HAProxy as deploy/haproxy writes it: 0.2 s checks; default 1).
set -euo pipefail

APPLIANCE=${APPLIANCE:-appliance}
CTL=${CTL:-$APPLIANCE}
BALANCER_WAIT_S=${BALANCER_WAIT_S:-1}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-120}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-120}

. "$(dirname "$0")/lib.sh"

for config in "$@"; do
    echo "== $config"
    if [ -n "$(running_pid "$config")" ]; then
        CTL=$CTL BALANCER_WAIT_S=$BALANCER_WAIT_S DRAIN_TIMEOUT_S=$STOP_TIMEOUT_S \
            "$(dirname "$0")/drain.sh" "$config"
        stop_host "$config" || exit 1
    fi
    start_host "$config" || { echo "$config: stopping the roll" >&2; exit 1; }
    $CTL ctl --config "$config" online
    sleep "$BALANCER_WAIT_S"
    echo "$config: upgraded, pid $(field "$config" pid)"
done
