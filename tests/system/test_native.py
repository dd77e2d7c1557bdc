"""The model worker's request path as pure Python, when it cannot or must not run compiled.

``make install`` compiles that path with mypyc where a C compiler is at hand
(appliance/native.py), and the suite runs it so; this is the other way a user
meets it: no compiler, or ``APPLIANCE_PURE=1``. The master's log says which.
"""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

from appliance import native
from tests.system.harness import demo_models, running


def test_pure_python_request_path_serves() -> None:
    with running(demo_models("identity", "simple"), env={native.PURE_ENV: "1"}) as appliance:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
        data = np.arange(8, dtype=np.float32).reshape(2, 4)
        tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        # A batched model's path too: the batcher, its keys and the split of outputs.
        inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
        for item in inputs:
            item.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        summed = client.infer("simple", inputs).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(summed, 2 * np.arange(16, dtype=np.int32).reshape(1, 16))
        client.close()
        said = "request path (model workers and frontends): pure Python (APPLIANCE_PURE is set)"
        assert said in appliance.log()
