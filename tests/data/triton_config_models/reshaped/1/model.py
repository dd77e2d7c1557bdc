"""OUT = 10 IN, made as 4 numbers a row; SEEN: the shape of IN execute was given."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            seen = np.tile(np.array(x.shape, dtype=np.int64), (x.shape[0], 1))
            out = (x * 10).reshape(x.shape[0], 4)
            outputs = [pb_utils.Tensor("OUT", out), pb_utils.Tensor("SEEN", seen)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
