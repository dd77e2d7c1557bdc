"""SUM = A + B, or A when the request leaves B out; HAS_B says which."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            total = a + b.as_numpy() if b is not None else a.copy()
            has_b = np.full((a.shape[0], 1), b is not None)
            outputs = [pb_utils.Tensor("SUM", total), pb_utils.Tensor("HAS_B", has_b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
