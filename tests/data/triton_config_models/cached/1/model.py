"""Y = 2 X; RUNS: how many requests execute has been given so far, this one included."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.runs += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            runs = np.full((x.shape[0], 1), self.runs, dtype=np.int64)
            outputs = [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("RUNS", runs)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
