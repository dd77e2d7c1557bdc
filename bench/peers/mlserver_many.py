"""MLServer runtimes for bench_models.py: ``simple`` and the ONNX and TorchScript digits.

Runs inside MLServer's own virtual environment (bench/.peers/mlserver), which
has no onnxruntime or torch: the appliance's site-packages (named by
BENCH_APPLIANCE_SITE) is appended to the end of ``sys.path``, so MLServer's
own packages still win and only those two come from the appliance's. Each
runtime is what a user would write for MLServer (it has no ONNX or TorchScript
runtime of its own): NumpyCodec in and out.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

if os.environ.get("BENCH_APPLIANCE_SITE"):
    sys.path.append(os.environ["BENCH_APPLIANCE_SITE"])


class Simple(MLModel):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [n, 16])."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        outputs = [
            NumpyCodec.encode_output("OUTPUT0", a + b),
            NumpyCodec.encode_output("OUTPUT1", a - b),
        ]
        return InferenceResponse(model_name=self.name, outputs=outputs)


class OnnxDigits(MLModel):
    """pixels FP32 [n, 64] -> probabilities, with ONNX Runtime on ``parameters.uri``."""

    async def load(self) -> bool:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # One thread, as the appliance's ONNX runtime runs on this host's share.
        options.intra_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        pixels = np.asarray(NumpyCodec.decode_input(payload.inputs[0]), dtype=np.float32)
        (probabilities,) = self.session.run(["probabilities"], {"pixels": pixels})
        output = NumpyCodec.encode_output("probabilities", probabilities)
        return InferenceResponse(model_name=self.name, outputs=[output])


class TorchDigits(MLModel):
    """pixels FP32 [n, 64] -> probabilities, a TorchScript module on ``parameters.uri``."""

    async def load(self) -> bool:
        import torch

        self.torch = torch
        # One thread, as the appliance's TorchScript runtime has by default.
        torch.set_num_threads(1)
        self.module = torch.jit.load(self.settings.parameters.uri, map_location="cpu").eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        pixels = np.asarray(NumpyCodec.decode_input(payload.inputs[0]), dtype=np.float32)
        with self.torch.inference_mode():
            probabilities = self.module(self.torch.from_numpy(pixels)).numpy()
        output = NumpyCodec.encode_output("probabilities", probabilities)
        return InferenceResponse(model_name=self.name, outputs=[output])
