"""A running sum per sequence, kept by the model itself (Triton's Python backend
carries no implicit state), with what each step saw of its sequence."""

import numpy as np
import triton_python_backend_utils as pb_utils

CONTROLS = ("START", "END", "READY", "CORRID")


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            controls = [
                int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])
                for name in CONTROLS
            ]
            start, end, ready, _corrid = controls
            if not ready:
                # Triton's "direct" batcher fills an empty slot with a request whose
                # READY is false; its answer goes nowhere.
                responses.append(pb_utils.InferenceResponse([]))
                continue
            sequence = request.correlation_id()
            if start:
                self.sums[sequence] = 0
            self.sums[sequence] += int(value.flat[0])
            total = self.sums.pop(sequence) if end else self.sums[sequence]
            seen = [*controls, int(sequence), request.flags()]
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", np.array([[total]], dtype=np.int32)),
                        pb_utils.Tensor("SEEN", np.array([seen], dtype=np.int64)),
                    ]
                )
            )
        return responses
