import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            parameters = json.loads(request.parameters())
            time.sleep(parameters.get("delay_ms", 0) / 1000)
            rows = x.shape[0]
            outputs = [
                pb_utils.Tensor("REQUESTS", np.full((rows, 1), len(requests), np.int32)),
                pb_utils.Tensor("WRITABLE", np.full((rows, 1), x.flags.writeable)),
                pb_utils.Tensor(
                    "PARAMETER",
                    np.array([[str(parameters.get("tag", "")).encode()]] * rows, dtype=object),
                ),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
