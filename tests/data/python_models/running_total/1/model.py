"""TOTAL = the sequence's values so far, carried as implicit state."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            before = pb_utils.get_input_tensor_by_name(request, "TOTAL_IN").as_numpy()
            total = before + value
            outputs = [pb_utils.Tensor("TOTAL", total), pb_utils.Tensor("TOTAL_OUT", total)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
