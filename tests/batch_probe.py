"""What Python-backend execute calls saw of 32 requests sent at once to batch_probe
(tests/data/python_models)."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

REQUESTS = 32


def batch_answers(url: str) -> list[tuple[int, bool, str]]:
    """Per request, in order: how many requests its execute got, whether its
    input was writable, and the tag parameter it carried (each is slow, so
    later ones queue and share an execute)."""
    client = httpclient.InferenceServerClient(url, concurrency=16)
    try:
        sent = []
        for number in range(REQUESTS):
            x = httpclient.InferInput("X", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[number]], dtype=np.int32))
            parameters = {"delay_ms": 30, "tag": f"t{number}"}
            sent.append(client.async_infer("batch_probe", [x], parameters=parameters))
        results = [request.get_result() for request in sent]
    finally:
        client.close()
    return [
        (
            int(r.as_numpy("REQUESTS")[0, 0]),
            bool(r.as_numpy("WRITABLE")[0, 0]),
            r.as_numpy("PARAMETER")[0, 0].decode(),
        )
        for r in results
    ]
