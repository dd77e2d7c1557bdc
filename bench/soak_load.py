"""The soak's load: what it calls on every protocol, the appliance it calls, and the bursts.

Apart from soak.py, which runs the soak and judges it, so that the load
reads on its own: the stock callers of tests/system/traffic.py plus two with
256 KiB tensors, and the warm-up's bursts of calls over many connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.system import traffic
from tests.system.harness import demo_models

LARGE = (1, 64 << 10)  # FP32: 256 KiB a tensor
BURST_CALLS = 30
SAMPLE_BURST_S = 0.2


class KserveRestLarge(traffic.KserveRest):
    protocol = "kserve-rest-256k"

    def __init__(self, ep: traffic.Endpoints) -> None:
        super().__init__(ep)
        self.model = "identity"

    def __call__(self, x: traffic.Array) -> traffic.Array:
        tensor = self.lib.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        result = self.client.infer(self.model, [tensor])
        return np.asarray(result.as_numpy("OUTPUT0"))

    @staticmethod
    def example(rng: np.random.Generator) -> traffic.Array:
        return rng.standard_normal(LARGE).astype(np.float32)

    @staticmethod
    def expected(x: traffic.Array) -> traffic.Array:
        return x


class KserveGrpcLarge(traffic.KserveGrpc):
    protocol = "kserve-grpc-256k"

    def __init__(self, ep: traffic.Endpoints) -> None:
        super().__init__(ep)
        self.model = "identity"

    def __call__(self, x: traffic.Array) -> traffic.Array:
        tensor = self.lib.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = self.client.infer(self.model, [tensor], client_timeout=traffic.DEADLINE_S)
        return np.asarray(result.as_numpy("OUTPUT0"))

    example = KserveRestLarge.example
    expected = KserveRestLarge.expected


CALLERS: tuple[type[traffic.Caller], ...] = (
    *traffic.EVERY_PROTOCOL,
    KserveRestLarge,
    KserveGrpcLarge,
)


def config() -> dict[str, Any]:
    faulty = {
        "name": "faulty",
        "class": "tests.system.faulty:Faulty",
        "instances": 2,
        "max_busy_s": 10.0,
    }
    return {
        "models": [faulty, *demo_models("identity")],
        "http": {"workers": "auto", "threads": 8},
        "grpc": {"workers": "auto", "threads": 8},
        "mip": {"workers": "auto", "listeners": [{"port": 0, "model": "faulty"}]},
        "shm": {"request_ring_bytes": 16 << 20, "response_ring_bytes": 16 << 20},
    }


# tritonclient's gRPC clients of one process share one connection unless
# each keeps its own subchannels; a burst needs one connection per client.
OWN_CONNECTION = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


def own_connection(caller: type[traffic.Caller]) -> type[traffic.Caller]:
    """``caller``, with a connection of its own where its library would share one."""
    if issubclass(caller, traffic.KserveGrpc):
        return type(caller.__name__, (caller,), {"channel_args": OWN_CONNECTION})
    return caller


def burst(ep: traffic.Endpoints, connections: int, watch: Callable[[], None]) -> list[str]:
    """Call every protocol over many connections at once, so lazy pools fill now.

    ``watch`` is called every SAMPLE_BURST_S while the burst runs.
    """
    errors: list[str] = []

    def calls(caller: type[traffic.Caller]) -> None:
        client = own_connection(caller)(ep)
        rng = np.random.default_rng()
        try:
            for _ in range(BURST_CALLS):
                client(caller.example(rng))
        except Exception as ex:
            errors.append(f"{caller.protocol}: {traffic.describe(ex)}")
        finally:
            client.close()

    threads = [
        threading.Thread(target=calls, args=(caller,), daemon=True)
        for caller in CALLERS
        for _ in range(connections)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + traffic.CALL_TIMEOUT_S * BURST_CALLS
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        watch()
        time.sleep(SAMPLE_BURST_S)
    return errors
