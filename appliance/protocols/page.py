"""The human-readable page at GET / (browsers): the host's state at a glance.

A placeholder until the dashboard lands: models, readiness, online state.
Everything is inline; the page loads nothing from elsewhere.
"""

from __future__ import annotations

import html

from appliance.client.api import ModelClient


def wants_html(accept: str | None) -> bool:
    """Return True when a client (a browser) asks for HTML."""
    return bool(accept) and "text/html" in (accept or "")


def render(client: ModelClient) -> str:
    """Return the page as HTML text."""
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        f"<td>{'ready' if client.model_ready(name) else 'not ready'}</td></tr>"
        for name in client.models()
    )
    state = "online" if client.status.online else "offline"
    ready = "ready" if client.server_ready() else "not ready"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>appliance</title></head>"
        f"<body><h1>appliance</h1><p>{state}, {ready}</p>"
        f"<table><tr><th>model</th><th>state</th></tr>{rows}</table></body></html>"
    )
