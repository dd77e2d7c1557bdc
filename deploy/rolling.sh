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

field() {  # field CONFIG NAME: one field of `ctl status --json`, or "" if down
    $CTL ctl --config "$1" --json status 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1]))' "$2" 2>/dev/null || true
}

wait_for() {  # wait_for SECONDS COMMAND...: poll every 0.1 s
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

ready() { [ "$(field "$1" ready)" = True ]; }
# A zombie (an exited child its starter has not reaped yet) counts as gone.
gone() { ! kill -0 "$1" 2>/dev/null || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

for config in "$@"; do
    echo "== $config"
    pid=$(field "$config" pid)
    if [ -n "$pid" ] && [ "$pid" != None ]; then
        CTL=$CTL BALANCER_WAIT_S=$BALANCER_WAIT_S DRAIN_TIMEOUT_S=$STOP_TIMEOUT_S \
            "$(dirname "$0")/drain.sh" "$config"
        $CTL ctl --config "$config" stop
        wait_for "$STOP_TIMEOUT_S" gone "$pid" || { echo "$config: pid $pid did not stop" >&2; exit 1; }
    fi
    log=$(dirname "$config")/appliance.log
    setsid $APPLIANCE serve --config "$config" >>"$log" 2>&1 </dev/null &
    if ! wait_for "$READY_TIMEOUT_S" ready "$config"; then
        echo "$config: not ready after ${READY_TIMEOUT_S} s; stopping the roll (see $log)" >&2
        exit 1
    fi
    $CTL ctl --config "$config" online
    sleep "$BALANCER_WAIT_S"
    echo "$config: upgraded, pid $(field "$config" pid)"
done
