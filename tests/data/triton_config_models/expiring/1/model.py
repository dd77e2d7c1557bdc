"""RAN: the tags of every request executed so far, this one's last, as JSON. A request whose
parameters hold "sleep" (seconds) holds the instance that long first."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.ran = []

    def execute(self, requests):
        responses = []
        for request in requests:
            sleep = json.loads(request.parameters()).get("sleep")
            if sleep:
                time.sleep(float(sleep))
            self.ran.append(int(pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy()[0][0]))
            out = np.array([[json.dumps(self.ran).encode()]], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RAN", out)]))
        return responses
