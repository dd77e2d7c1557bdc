"""The standard gRPC health service (grpc.health.v1) over the appliance's readiness.

Load balancers and Kubernetes gRPC probes call ``Check``; it answers SERVING
while the host is online and every model has a ready instance, NOT_SERVING
otherwise (offline, draining, or a model without a ready instance).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from appliance._generated import health_pb2, health_pb2_grpc
from appliance.client.api import ModelClient
from appliance.protocols.grpc_server import GrpcServer
from appliance.protocols.threads import Threads

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WATCH_INTERVAL_S = 0.5
Context = grpc.aio.ServicerContext[Any, Any]


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def _status(self) -> health_pb2.HealthCheckResponse.ServingStatus:
        return _SERVING if self.client.server_ready() else _NOT_SERVING

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self._status())

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        # Ends when the client leaves: gRPC cancels this generator.
        last: health_pb2.HealthCheckResponse.ServingStatus | None = None
        while True:
            status = self._status()
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(WATCH_INTERVAL_S)


def add_to_server(server: GrpcServer, client: ModelClient, _threads: Threads) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(client), server)
