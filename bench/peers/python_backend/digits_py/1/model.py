"""pixels [n,64] -> probabilities [n,10]: the appliance's digits MLP in numpy, per request."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

PIXEL_SCALE = np.float32(1.0 / 16.0)


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(os.path.dirname(__file__), "digits_weights.npz")
        with np.load(path) as data:
            count = len(data.files) // 2
            self.layers = [
                (data[f"w{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32))
                for i in range(count)
            ]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "pixels").as_numpy()
            activations = x.astype(np.float32) * PIXEL_SCALE
            *hidden, (last_weight, last_bias) = self.layers
            for weight, bias in hidden:
                activations = np.maximum(activations @ weight + bias, np.float32(0.0))
            logits = activations @ last_weight + last_bias
            logits -= logits.max(axis=1, keepdims=True)
            exps = np.exp(logits)
            probabilities = exps / exps.sum(axis=1, keepdims=True)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("probabilities", probabilities)])
            )
        return responses
