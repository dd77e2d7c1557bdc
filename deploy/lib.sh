# Shell helpers shared by deploy/rolling.sh and deploy/local-fleet.sh:
# source it after setting CTL (the command that talks to running hosts).

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

running_pid() {  # running_pid CONFIG: the host's master pid, or "" if down
    local pid
    pid=$(field "$1" pid)
    [ "$pid" = None ] || echo "$pid"
}

# A zombie (an exited child its starter has not reaped yet) counts as gone.
gone() { ! kill -0 "$1" 2>/dev/null || grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

start_host() {  # start_host CONFIG: serve it in the background, log beside it
    local log
    log=$(dirname "$1")/appliance.log
    setsid $APPLIANCE serve --config "$1" >>"$log" 2>&1 </dev/null &
    if ! wait_for "$READY_TIMEOUT_S" ready "$1"; then
        echo "$1: not ready after ${READY_TIMEOUT_S} s (see $log)" >&2
        return 1
    fi
}

stop_host() {  # stop_host CONFIG: SIGTERM drain through ctl, wait until gone
    local pid
    pid=$(running_pid "$1")
    [ -n "$pid" ] || return 0
    $CTL ctl --config "$1" stop >/dev/null
    wait_for "$STOP_TIMEOUT_S" gone "$pid" || { echo "$1: pid $pid did not stop" >&2; return 1; }
}
