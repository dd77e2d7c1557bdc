"""SEEN: every request execute got before this one, as JSON: rows, row shape and the
first row's values (None where they are random)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = []

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            seen = json.dumps(self.seen)
            first = x[0].tolist()
            whole = all(float(v).is_integer() for v in first)
            self.seen.append([x.shape[0], list(x.shape[1:]), first if whole else None])
            out = np.array([[seen.encode()]] * x.shape[0], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", out)]))
        return responses
