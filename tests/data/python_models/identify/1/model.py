"""WHO: JSON of the request's id and the answering instance's name, kind and device; a
request whose X is above 0 holds its instance that many seconds first."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = {
            key: args[key]
            for key in ("model_instance_name", "model_instance_kind", "model_instance_device_id")
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if x > 0:
                time.sleep(x)
            who = {"request_id": request.request_id(), **self.instance}
            out = np.array([json.dumps(who).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WHO", out)]))
        return responses
