import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        do = json.loads(requests[0].parameters()).get("do", "")
        if do == "raise":
            raise ValueError("asked to raise")
        if do == "count":
            return []
        if do == "error":
            error = pb_utils.TritonError("X must be positive", pb_utils.TritonError.INVALID_ARG)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if do == "object":
            return [{"Y": 1} for _ in requests]
        if do == "sleep":
            time.sleep(float(json.loads(requests[0].parameters()).get("seconds", 1)))
        if do == "write":
            for r in requests:
                pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0] = 0
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
