"""The standard gRPC health service (grpc.health.v1) over the appliance's readiness.

Load balancers and Kubernetes gRPC probes call ``Check``; it answers SERVING
while the host is online and every model has a ready instance, NOT_SERVING
otherwise (offline, draining, or a model without a ready instance).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from appliance._generated import health_pb2, health_pb2_grpc
from appliance.client.api import ModelClient

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WATCH_INTERVAL_S = 0.5


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def _status(self) -> health_pb2.HealthCheckResponse.ServingStatus:
        return _SERVING if self.client.server_ready() else _NOT_SERVING

    def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self._status())

    def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.HealthCheckResponse]:
        last: health_pb2.HealthCheckResponse.ServingStatus | None = None
        while context.is_active():
            status = self._status()
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            time.sleep(WATCH_INTERVAL_S)


def add_to_server(server: grpc.Server, client: ModelClient) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(client), server)
