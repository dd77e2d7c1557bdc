"""A decoupled sequence model's steps over one KServe gRPC stream (the model is
tests/data/python_models/accumulate_stream), as real Triton and the appliance answer
them (tests/peers/test_python_backend_oracle.py, tests/system/test_python_backend.py)."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient


def sequence_streamed(url: str, steps: list[tuple[int, int, str]]) -> list[Any]:
    """accumulate_stream's responses to each step (sequence id, value, flag) on one gRPC
    stream, a step sent once the one before has ended; an error as its message."""
    client = grpcclient.InferenceServerClient(url)
    parts: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: parts.put((result, error)))
    answers: list[Any] = []
    try:
        for sequence, value, flag in steps:
            x = grpcclient.InferInput("VALUE", [1], "INT32")
            x.set_data_from_numpy(np.array([value], np.int32))
            client.async_stream_infer(
                "accumulate_stream",
                [x],
                sequence_id=sequence,
                sequence_start=flag in ("start", "both"),
                sequence_end=flag in ("end", "both"),
                enable_empty_final_response=True,
            )
            got: list[Any] = []
            while True:
                result, error = parts.get(timeout=30)
                if error is not None:
                    got.append(("error", error.message()))
                    break
                response = result.get_response()
                if response.parameters["triton_final_response"].bool_param:
                    break
                name = response.outputs[0].name
                got.append((name, result.as_numpy(name).tolist()))
            answers.append(got)
    finally:
        client.stop_stream()
        client.close()
    return answers
