"""A running sum per sequence, sent as its own response, then what the step saw."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = int(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            start, end, corrid = (
                int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0])
                for name in ("START", "END", "CORRID")
            )
            sequence = request.correlation_id()
            if start:
                self.sums[sequence] = 0
            self.sums[sequence] += value
            total = self.sums.pop(sequence) if end else self.sums[sequence]
            seen = [start, end, corrid, int(sequence), request.flags()]
            for name, values, dtype in (("SUM", [total], np.int32), ("SEEN", seen, np.int64)):
                tensor = pb_utils.Tensor(name, np.array(values, dtype))
                sender.send(pb_utils.InferenceResponse([tensor]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
