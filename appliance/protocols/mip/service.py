"""Answer MIP inference frames for one model through the client API.

The frontend owns the sockets; this module turns one inference payload into
one reply frame (a response or an error frame), calling the model with
``ModelClient.infer_async``. It never raises for a bad request.
"""

from __future__ import annotations

import asyncio
import logging

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError
from appliance.protocols.mip import batch, codec
from appliance.protocols.mip.batch import Binding, Chunk
from appliance.protocols.mip.codec import ErrorCode, InferRequest, Kind, MipError
from appliance.protocols.mip.errors import from_appliance

log = logging.getLogger("appliance.mip")


class MipService:
    """Serve MIP inference requests for ``model``."""

    def __init__(self, client: ModelClient, model: str) -> None:
        self.client = client
        self.model = model

    async def infer(self, payload: bytes | bytearray) -> bytes:
        """Return the reply frame to one inference payload (the frontend logs its access
        line: frontends/observe.py)."""
        try:
            return await self._infer(payload)
        except MipError as ex:
            return codec.encode_error(ex.code, ex.message)
        except ApplianceError as ex:
            error = from_appliance(ex)
            return codec.encode_error(error.code, error.message)
        except MemoryError:
            return codec.encode_error(ErrorCode.MEMORY, f"model {self.model}: out of memory")
        except Exception:
            log.exception("MIP request for model %s failed", self.model)
            return codec.encode_error(
                ErrorCode.INTERNAL, f"model {self.model}: internal error (see the server log)"
            )

    async def _infer(self, payload: bytes | bytearray) -> bytes:
        request = codec.decode_infer_request(payload)
        binding = batch.bind(self.client.metadata(self.model), request.n_input)
        chunks = batch.plan(binding, request)
        if len(chunks) == 1:
            # PERF: one chunk is encoded straight into the reply frame, so the
            # outputs are copied once, out of shared memory.
            with await self.client.infer_async(self.model, chunks[0].inputs) as result:
                names, rows = batch.encode_chunk(binding, chunks[0], request, result.outputs)
                pieces = [piece for row in rows for piece in row]
                return codec.encode_infer_response(
                    request.n_input, len(names), request.batch_size, pieces
                )
        done = await asyncio.gather(
            *(self._run(binding, chunk, request) for chunk in chunks), return_exceptions=True
        )
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        results = [outcome for outcome in done if not isinstance(outcome, BaseException)]
        names = results[0][0]
        if any(other != names for other, _parts in results):
            raise MipError(
                ErrorCode.INTERNAL,
                f"model {self.model} returned different outputs for parts of one batch",
            )
        joined = [row for _names, parts in results for row in parts]
        return codec.encode_infer_response(request.n_input, len(names), request.batch_size, joined)

    async def _run(
        self, binding: Binding, chunk: Chunk, request: InferRequest
    ) -> tuple[tuple[str, ...], list[bytes]]:
        with await self.client.infer_async(self.model, chunk.inputs) as result:
            names, rows = batch.encode_chunk(binding, chunk, request, result.outputs)
            return names, [b"".join(row) for row in rows]


def status_of(reply: bytes) -> str:
    """A reply frame's status, as its access line says it: OK, or the error code's name."""
    return ErrorCode(reply[2]).name if reply[1] == Kind.ERROR else "OK"
