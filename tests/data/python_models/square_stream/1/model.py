import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            asked = request.request_id()
            thread = threading.Thread(target=self.answer, args=(sender, n, asked), daemon=True)
            self.threads.append(thread)
            thread.start()
        return None

    def answer(self, sender, n, asked):
        if n < 0:
            error = pb_utils.TritonError("IN must be >= 0", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error))
        for index in range(max(n, 0)):
            outputs = [
                pb_utils.Tensor("OUT", np.array([n], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.int32)),
                pb_utils.Tensor("ID", np.array([asked.encode()], dtype=object)),
            ]
            sender.send(pb_utils.InferenceResponse(outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join(5)
