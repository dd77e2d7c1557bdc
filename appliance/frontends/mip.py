"""The MIP frontend: asyncio TCP servers sharing their ports with SO_REUSEPORT.

MIP has no model field, so each configured listener (a port) serves one
model; every MIP process listens on every port. A connection may carry one
request (as KubeMo's client sends) or many in a row. A ping is answered with
a pong while the host is ready (online, every model with a ready instance)
and with an INTERNAL error frame otherwise, so a TCP health check that pings
sees a draining host as down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from appliance import logs
from appliance.client.api import ModelClient
from appliance.core.status import SlotState
from appliance.exitcodes import ExitCode
from appliance.frontends.context import FrontendContext
from appliance.process import become_child
from appliance.protocols.mip import codec

log = logging.getLogger("appliance.mip")

READ_TIMEOUT_S = 30.0


class MipServer:
    """Serve MIP connections for one model."""

    def __init__(self, client: ModelClient, model: str) -> None:
        self.client = client
        self.model = model

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    header = await asyncio.wait_for(reader.readexactly(8), READ_TIMEOUT_S)
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                reply, keep_open = await self.answer(header, reader)
                writer.write(reply)
                await writer.drain()
                if not keep_open:
                    return
        except ConnectionError:
            return
        finally:
            writer.close()

    async def answer(self, header: bytes, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        """Return the reply to one frame and whether the connection stays usable."""
        version, kind, subtype, _remaining = codec.decode_header(header)
        if version != codec.VERSION:
            return codec.encode_error(codec.ErrorCode.PROTOCOL), False
        if subtype != codec.Subtype.REQUEST:
            return codec.encode_error(codec.ErrorCode.SUBTYPE), False
        if kind == codec.Kind.PING:
            if self.client.server_ready():
                return codec.PONG, True
            return codec.encode_error(codec.ErrorCode.INTERNAL), True
        return codec.encode_error(codec.ErrorCode.METHOD), False


def parse_listeners(text: str) -> list[tuple[int, str]]:
    """Parse the master's ``port=model,...`` argument."""
    listeners = []
    for item in filter(None, text.split(",")):
        port, _, model = item.partition("=")
        listeners.append((int(port), model))
    return listeners


async def serve(context: FrontendContext, slot: int, listeners: list[tuple[int, str]]) -> None:
    client = context.client(publish_slot=slot)
    host = context.config.server.host
    servers = []
    for port, model in listeners:
        mip = MipServer(client, model)
        servers.append(await asyncio.start_server(mip.handle, host, port, reuse_port=True))
        log.info("listening on %s:%d for model %s", host, port, model)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    context.status.set_state(slot, SlotState.READY, os.getpid())
    try:
        await stop.wait()
    finally:
        context.status.set_state(slot, SlotState.STOPPING)
        for server in servers:
            server.close()
            await server.wait_closed()
        client.close()


def run(
    tree_dir: Path, master_pid: int, slot: int, listeners: list[tuple[int, str]], index: int
) -> int:
    """Serve every MIP listener until SIGTERM."""
    context = FrontendContext.open(tree_dir)
    title = f"mip[{index}]"
    logs.setup(title, context.config.server.log_level)
    become_child(title, master_pid)
    asyncio.run(serve(context, slot, listeners))
    return ExitCode.OK
