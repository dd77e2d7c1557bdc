"""The dashboard's first render: complete HTML from one state document.

The tables are filled on the server, so the page says what the host is
doing even with scripting off; the inline script (``assets.py``) then polls
:data:`STATE_PATH` and redraws everything, charts included, every second.
"""

from __future__ import annotations

import html
from typing import Any

import orjson

from appliance.client.status_format import SUMMARY_ABOVE, format_sizing
from appliance.protocols.dashboard.assets import SCRIPT, STYLE

STATE_PATH = "/dashboard/state"
ONLINE_PATH = "/dashboard/online"
POLL_INTERVAL_MS = 1000

_MODEL_COLUMNS = (
    "model",
    "state",
    "instances",
    "req/s",
    "err/s",
    "mean ms",
    "p99 ms",
    "queue ms",
    "compute ms",
    "rows/batch",
    "calls",
    "errors",
)
_PROCESS_COLUMNS = ("pid", "role", "model", "state", "restarts", "RSS", "CPU", "device")
_CHARTS = (
    ("rate", "requests/s by model"),
    ("latency", "latency in ms: mean by model; p99 of all calls dashed"),
    ("protocol", "requests/s by protocol"),
)
_CARDS = (
    ("rps", "requests/s"),
    ("eps", "errors/s"),
    ("p50", "p50 latency"),
    ("p99", "p99 latency"),
)


def render(state: dict[str, Any]) -> str:
    """Return the page for ``state`` (see ``state.collect``)."""
    # A "<" in a string ("</script>", "<!--") could end the script element
    # early; \u003c is the same JSON string, and "<" appears nowhere else.
    initial = orjson.dumps(state).decode().replace("<", "\\u003c")
    script = (
        SCRIPT.replace("STATE_PATH", STATE_PATH)
        .replace("ONLINE_PATH", ONLINE_PATH)
        .replace("POLL_MS", str(POLL_INTERVAL_MS))
    )
    return "".join(
        [
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>appliance</title><style>{STYLE}</style></head><body>",
            _header(state),
            _cards(),
            _charts(),
            "<h2>models</h2>",
            _folded(
                "models",
                _table(_MODEL_COLUMNS, "models", _model_rows(state)),
                ["ready" if m["ready"] else "not ready" for m in state["models"]]
                + ["unloaded"] * len(state["unloaded"]),
            ),
            "<h2>processes</h2>",
            _folded(
                "processes",
                _table(
                    _PROCESS_COLUMNS, "processes", [_process_row(p) for p in state["processes"]]
                ),
                [str(p.get("state", "")) for p in state["processes"]],
            ),
            _sizing(state.get("sizing")),
            "<footer id='updated'>updated when loaded; refreshes every second</footer>",
            f"<script id='initial' type='application/json'>{initial}</script>",
            f"<script>{script}</script></body></html>",
        ]
    )


def tally(noun: str, states: list[str]) -> str:
    """Return "200 models: 198 ready, 2 not ready" (the script writes the same)."""
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return f"{len(states)} {noun}: " + ", ".join(f"{count} {state}" for state, count in ranked)


def _folded(key: str, table: str, states: list[str]) -> str:
    """The table of ``key`` (one row per state) under a line that counts its rows
    by state, folded away when it is long (hundreds of models)."""
    opened = " open" if len(states) <= SUMMARY_ABOVE else ""
    return (
        f"<details id='{key}-box'{opened}><summary id='{key}-summary'>"
        f"{html.escape(tally(key, states))}</summary>{table}</details>"
    )


def state_label(state: dict[str, Any]) -> tuple[str, str]:
    """Return the badge text and its class (ok, warn, off) for a state."""
    words = ["online" if state["online"] else "offline"]
    words.append("ready" if state["ready"] else "not ready")
    if state["draining"]:
        words.append("draining")
    if (state.get("master") or {}).get("reloading"):
        words.append("reloading")
    kind = "off" if not state["online"] else ("ok" if state["ready"] else "warn")
    return ", ".join(words), kind


def _header(state: dict[str, Any]) -> str:
    label, kind = state_label(state)
    button = "Take offline" if state["online"] else "Bring online"
    return (
        "<header><h1>appliance</h1>"
        f"<span id='badge' class='badge {kind}'>{html.escape(label)}</span>"
        f"<button id='toggle' type='button'>{button}</button>"
        f"<span id='host' class='muted'>{html.escape(host_line(state))}</span>"
        "<span id='message' class='muted'></span></header>"
    )


def host_line(state: dict[str, Any]) -> str:
    """Return "tree t · master pid p · up 5 min · http 8000 · ..." for a state."""
    master = state.get("master")
    if not master:
        return "master not answering"
    parts = [f"tree {master['tree']}", f"master pid {master['pid']}"]
    parts.append(f"up {_duration(float(master.get('uptime_s') or 0))}")
    parts += [f"{name} {port}" for name, port in (master.get("ports") or {}).items()]
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _cards() -> str:
    cards = "".join(
        f"<div class='card'><div class='label'>{label}</div>"
        f"<div class='big' id='{key}'>-</div></div>"
        for key, label in _CARDS
    )
    return f"<section class='cards'>{cards}</section>"


def _charts() -> str:
    figures = "".join(
        f"<figure><figcaption>{caption}</figcaption>"
        f"<svg id='chart-{key}' viewBox='0 0 640 200'>"
        "<text x='320' y='100' text-anchor='middle' class='axis'>collecting...</text></svg>"
        f"<div class='legend' id='legend-{key}'></div></figure>"
        for key, caption in _CHARTS
    )
    return f"<section class='charts'>{figures}</section>"


def _table(columns: tuple[str, ...], body_id: str, rows: list[str]) -> str:
    head = "".join(f"<th>{column}</th>" for column in columns)
    body = "".join(rows)
    return (
        f"<table class='{body_id}'><thead><tr>{head}</tr></thead>"
        f"<tbody id='{body_id}'>{body}</tbody></table>"
    )


def _cells(values: list[object]) -> str:
    return "".join(f"<td>{html.escape(str(value))}</td>" for value in values)


def _model_rows(state: dict[str, Any]) -> list[str]:
    calls = state["traffic"]["models"]
    rows = [_model_row(model, calls.get(model["name"])) for model in state["models"]]
    return rows + [f"<tr>{_cells([name, 'unloaded', '-'])}</tr>" for name in state["unloaded"]]


def _model_row(model: dict[str, Any], calls: dict[str, Any] | None) -> str:
    """One model's row; rates need two readings, so the script fills them."""
    ok, fail = (calls["ok"], calls["fail"]) if calls else (0, 0)
    instances = model["instances"]
    ready = sum(1 for instance in instances if instance["state"] == "ready")
    done, batches = model["success"], model["batches"]
    values = [
        model["name"],
        "ready" if model["ready"] else "not ready",
        f"{ready}/{len(instances)} ready",
        "-",
        "-",
        "-",
        "-",
        f"{model['queue_ns'] / done / 1e6:.2f}" if done else "-",
        f"{model['compute_ns'] / batches / 1e6:.2f}" if batches else "-",
        f"{model['rows'] / batches:.1f}" if batches else "-",
        f"{ok + fail:.0f}",
        f"{fail:.0f}",
    ]
    return f"<tr>{_cells(values)}</tr>"


def _process_row(process: dict[str, Any]) -> str:
    rss, cpu = process.get("rss_bytes"), process.get("cpu_percent")
    values = [
        process.get("pid") or "-",
        process.get("role", ""),
        process.get("model") or "-",
        process.get("state", ""),
        "-" if process.get("restarts") is None else process["restarts"],
        "-" if rss is None else f"{rss / 1e6:.1f} MB",
        "-" if cpu is None else f"{cpu:.1f} %",
        _device(process),
    ]
    return f"<tr>{_cells(values)}</tr>"


def _sizing(sizing: dict[str, Any] | None) -> str:
    """How many processes of each kind run, and which "auto" chose for the CPUs."""
    return f"<p class='sizing'>{html.escape(format_sizing(sizing))}</p>" if sizing else ""


def _device(process: dict[str, Any]) -> str:
    device, memory = process.get("device"), process.get("device_memory_bytes")
    if not device:
        return "-"
    return f"{device} ({memory / 1e6:.1f} MB)" if device.startswith("cuda") and memory else device
