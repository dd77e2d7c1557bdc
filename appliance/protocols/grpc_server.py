"""What a protocol registers its gRPC services with.

The gRPC frontend hands each protocol's ``add_to_server`` a stand-in for
its grpc.aio server that wraps every handler added, once
(``frontends/grpc_registry.py``). A protocol sees only the two methods the
generated ``add_*Servicer_to_server`` functions call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import grpc

# grpc-stubs makes these generic; at run time they are plain classes.
if TYPE_CHECKING:
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    GenericHandler: TypeAlias = grpc.GenericRpcHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    GenericHandler = grpc.GenericRpcHandler


class GrpcServer(Protocol):
    """The registering half of a grpc.aio server."""

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Sequence[GenericHandler]) -> None:
        """Serve the methods these handlers find."""

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, Handler]
    ) -> None:
        """Serve ``service_name``'s methods, by name."""
