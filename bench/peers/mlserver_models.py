"""MLServer runtimes for the benchmark: the appliance's ``identity`` and ``digits``.

Runs inside MLServer's own virtual environment (bench/.peers/mlserver), never
in the appliance's. Both models use MLServer's documented path, NumpyCodec in
and out, as a user writing a custom runtime would. ``digits`` loads the
appliance's committed weights (``parameters.uri``) with numpy and computes
what appliance/demos/digits.py computes.
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

PIXEL_SCALE = np.float32(1.0 / 16.0)


class Identity(MLModel):
    """INPUT0 FP32 -> OUTPUT0, the same tensor."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        array = NumpyCodec.decode_input(payload.inputs[0])
        output = NumpyCodec.encode_output("OUTPUT0", array)
        return InferenceResponse(model_name=self.name, outputs=[output])


class Digits(MLModel):
    """pixels FP32 [n,64] -> probabilities FP32 [n,10]: the appliance's MLP."""

    async def load(self) -> bool:
        path = self.settings.parameters.uri
        with np.load(path) as data:
            count = len(data.files) // 2
            self.layers = [
                (data[f"w{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32))
                for i in range(count)
            ]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        pixels = NumpyCodec.decode_input(payload.inputs[0])
        activations = np.asarray(pixels, dtype=np.float32) * PIXEL_SCALE
        *hidden, (last_weight, last_bias) = self.layers
        for weight, bias in hidden:
            activations = np.maximum(activations @ weight + bias, np.float32(0.0))
        logits = activations @ last_weight + last_bias
        logits -= logits.max(axis=1, keepdims=True)
        exps = np.exp(logits)
        probabilities = exps / exps.sum(axis=1, keepdims=True)
        output = NumpyCodec.encode_output("probabilities", probabilities)
        return InferenceResponse(model_name=self.name, outputs=[output])
