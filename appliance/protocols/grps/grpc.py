"""grps gRPC service on the gRPC frontend (not implemented yet)."""

from __future__ import annotations

import grpc

from appliance.client.api import ModelClient


def add_to_server(server: grpc.Server, client: ModelClient) -> None:
    """Register this protocol's servicer; nothing yet."""
