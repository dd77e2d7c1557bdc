"""The human-readable page at GET / (browsers): the host's state and traffic.

SPEC: grps.md "Metrics接口" — GRPS serves a metrics page at the root of its
HTTP port. This one shows whether the host is online and ready, each model's
readiness, instances and traffic, and every process. The first render is
complete HTML; an inline script then polls :data:`MONITOR_PATH` (JSON from
:func:`snapshot`) every few seconds and adds rates over the last minute and
a five-minute sparkline of requests per second. Everything is inline: the
page loads nothing from elsewhere.
"""

from __future__ import annotations

import html
import time
from typing import Any

import orjson

from appliance.client.api import ModelClient
from appliance.core.status import Counter, Role, SlotState

# Served by the GRPS routes (GRPS keeps its monitor data under /grps/v1/monitor).
MONITOR_PATH = "/grps/v1/monitor/metrics"
POLL_INTERVAL_MS = 2000


def wants_html(accept: str | None) -> bool:
    """Return True when a client (a browser) asks for HTML."""
    return bool(accept) and "text/html" in (accept or "")


def snapshot(client: ModelClient) -> dict[str, Any]:
    """Return the host's state and cumulative counters, as the page polls them."""
    status = client.status
    return {
        "time_ms": int(time.time() * 1000),
        "online": status.online,
        "draining": status.draining,
        "ready": client.server_ready(),
        "models": [_model(client, name) for name in client.models()],
        "processes": _processes(client),
    }


def _model(client: ModelClient, name: str) -> dict[str, Any]:
    counts = client.counters(name)
    return {
        "name": name,
        "ready": client.model_ready(name),
        "instances": len(client.router.slots.get(name, ())),
        "success": counts[Counter.SUCCESS],
        "fail": counts[Counter.FAIL],
        "batches": counts[Counter.BATCHES],
        "queue_ns": counts[Counter.QUEUE_NS],
        "compute_ns": counts[Counter.COMPUTE_NS],
        "last_inference_ms": counts[Counter.LAST_INFERENCE_MS],
    }


def _processes(client: ModelClient) -> list[dict[str, Any]]:
    processes = []
    for index in range(client.status.n_slots):
        info = client.status.read(index)
        if info.role is Role.NONE or info.state is SlotState.EMPTY:
            continue
        label = f"{info.name}#{info.instance}" if info.role is Role.MODEL else ""
        processes.append(
            {
                "role": info.role.name.lower(),
                "name": label,
                "pid": info.pid,
                "state": info.state.name.lower(),
                "depth": info.depth,
            }
        )
    return processes


def render(client: ModelClient) -> str:
    """Return the page as HTML text."""
    data = snapshot(client)
    state = ("online" if data["online"] else "offline") + (", draining" if data["draining"] else "")
    ready = "ready" if data["ready"] else "not ready"
    models = "".join(_model_row(model) for model in data["models"])
    processes = "".join(_process_row(process) for process in data["processes"])
    # "</" would end the script element early; "<\/" is the same JSON string.
    initial = orjson.dumps(data).decode().replace("</", "<\\/")
    return (
        _HEAD
        + f"<h1>appliance <span id='state'>{state}, {ready}</span></h1>"
        + "<h2>models</h2><table><thead><tr><th>model</th><th>state</th><th>instances</th>"
        "<th>req/s</th><th>fail/s</th><th>queue ms</th><th>compute ms</th>"
        "<th>requests</th><th>failures</th></tr></thead>"
        + f"<tbody id='models'>{models}</tbody></table>"
        + "<h2>requests per second, last 5 minutes</h2>"
        "<svg id='spark' width='600' height='60' viewBox='0 0 600 60'></svg>"
        + "<h2>processes</h2><table><thead><tr><th>role</th><th>model</th><th>pid</th>"
        "<th>state</th><th>in flight</th></tr></thead>"
        + f"<tbody id='processes'>{processes}</tbody></table>"
        + f"<script id='initial' type='application/json'>{initial}</script>"
        + _SCRIPT.replace("MONITOR_PATH", MONITOR_PATH).replace("POLL_MS", str(POLL_INTERVAL_MS))
        + "</body></html>"
    )


def _cells(values: list[object]) -> str:
    return "".join(f"<td>{html.escape(str(value))}</td>" for value in values)


def _model_row(model: dict[str, Any]) -> str:
    done = model["success"]
    queue = f"{model['queue_ns'] / done / 1e6:.2f}" if done else "-"
    compute = f"{model['compute_ns'] / model['batches'] / 1e6:.2f}" if model["batches"] else "-"
    state = "ready" if model["ready"] else "not ready"
    values = [model["name"], state, model["instances"], "-", "-", queue, compute]
    return f"<tr>{_cells([*values, done + model['fail'], model['fail']])}</tr>"


def _process_row(process: dict[str, Any]) -> str:
    keys = ("role", "name", "pid", "state", "depth")
    return f"<tr>{_cells([process[key] for key in keys])}</tr>"


_HEAD = (
    "<!doctype html><html><head><meta charset='utf-8'><title>appliance</title><style>"
    "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}"
    "table{border-collapse:collapse}td,th{padding:.25em .8em;border-bottom:1px solid #ddd;"
    "text-align:right}td:first-child,th:first-child{text-align:left}"
    "h1 span{font-size:.6em;padding:.2em .5em;border-radius:.3em;background:#eee}"
    "svg{border:1px solid #ddd}polyline{fill:none;stroke:#36c;stroke-width:1.5}"
    "</style></head><body>"
)

# Rates come from the difference between the newest snapshot and the oldest
# one of the last minute; the sparkline keeps five minutes of snapshots.
_SCRIPT = """<script>
(function () {
  var history = [JSON.parse(document.getElementById('initial').textContent)];
  function cell(row, text) { var td = row.insertCell(); td.textContent = text; }
  function fixed(x) { return isFinite(x) ? x.toFixed(2) : '-'; }
  function since(now, ms) {
    for (var i = 0; i < history.length; i++) {
      if (now.time_ms - history[i].time_ms <= ms) return history[i];
    }
    return now;
  }
  function byName(snap, name) {
    for (var i = 0; i < snap.models.length; i++) {
      if (snap.models[i].name === name) return snap.models[i];
    }
    return null;
  }
  function draw(now) {
    var old = since(now, 60000), dt = (now.time_ms - old.time_ms) / 1000;
    document.getElementById('state').textContent =
      (now.online ? 'online' : 'offline') + (now.draining ? ', draining' : '') +
      (now.ready ? ', ready' : ', not ready');
    var body = document.getElementById('models');
    body.textContent = '';
    now.models.forEach(function (m) {
      var o = byName(old, m.name) || m;
      var done = m.success - o.success, batches = m.batches - o.batches;
      var row = body.insertRow();
      cell(row, m.name); cell(row, m.ready ? 'ready' : 'not ready'); cell(row, m.instances);
      cell(row, dt > 0 ? fixed((done + m.fail - o.fail) / dt) : '-');
      cell(row, dt > 0 ? fixed((m.fail - o.fail) / dt) : '-');
      cell(row, fixed(done ? (m.queue_ns - o.queue_ns) / done / 1e6
                           : m.queue_ns / m.success / 1e6));
      cell(row, fixed(batches ? (m.compute_ns - o.compute_ns) / batches / 1e6
                               : m.compute_ns / m.batches / 1e6));
      cell(row, m.success + m.fail); cell(row, m.fail);
    });
    var procs = document.getElementById('processes');
    procs.textContent = '';
    now.processes.forEach(function (p) {
      var row = procs.insertRow();
      [p.role, p.name, p.pid, p.state, p.depth].forEach(function (v) { cell(row, v); });
    });
    spark();
  }
  function total(snap) {
    return snap.models.reduce(function (sum, m) { return sum + m.success + m.fail; }, 0);
  }
  function spark() {
    var points = [], svg = document.getElementById('spark');
    for (var i = 1; i < history.length; i++) {
      var dt = (history[i].time_ms - history[i - 1].time_ms) / 1000;
      points.push(dt > 0 ? (total(history[i]) - total(history[i - 1])) / dt : 0);
    }
    var top = Math.max.apply(null, points.concat([1])), step = 600 / Math.max(points.length - 1, 1);
    var line = points.map(function (v, i) { return (i * step) + ',' + (58 - 56 * v / top); });
    svg.innerHTML = '<polyline points="' + line.join(' ') + '"></polyline>' +
      '<text x="4" y="12" font-size="10">max ' + top.toFixed(1) + '/s</text>';
  }
  function poll() {
    fetch('MONITOR_PATH', {cache: 'no-store'}).then(function (r) { return r.json(); })
      .then(function (now) {
        history.push(now);
        while (history.length && now.time_ms - history[0].time_ms > 300000) history.shift();
        draw(now);
      }).catch(function () {
        document.getElementById('state').textContent = 'unreachable';
      });
  }
  setInterval(poll, POLL_MS);
})();
</script>"""
