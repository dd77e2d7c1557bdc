"""graphpipe REST routes on the HTTP frontend (not implemented yet)."""

from __future__ import annotations

from appliance.client.api import ModelClient
from appliance.protocols.web import App


def add_routes(app: App, client: ModelClient) -> None:
    """Mount this protocol's routes; nothing yet."""
