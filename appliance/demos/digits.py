"""A small MLP that classifies scikit-learn's 8x8 handwritten digits.

Input ``pixels`` is a batch of flattened 8x8 images with the dataset's raw
intensities (0..16); output ``probabilities`` is the softmax over the ten
digit classes. The network is 64 -> 64 (ReLU) -> 64 (ReLU) -> 10, trained by
``tools/train_digits.py``, which writes the committed ``digits_weights.npz``
next to this module. Held-out accuracy (20% stratified split, 360 images):
0.9694 (349 of 360). Serving needs only numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.model import Model, Outputs, spec

__all__ = ["Digits"]

Float32Array = npt.NDArray[np.float32]

# Training scaled the raw 0..16 intensities to 0..1; serving must match.
PIXEL_SCALE = np.float32(1.0 / 16.0)
WEIGHTS_FILE = "digits_weights.npz"


class Digits(Model):
    """Digit classifier; option ``weights`` overrides the bundled weights file."""

    inputs = [spec("pixels", "FP32", [-1, 64])]
    outputs = [spec("probabilities", "FP32", [-1, 10])]
    max_batch_size = 64
    description = "MLP classifier for 8x8 digit images (raw 0..16 pixels)"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._layers: list[tuple[Float32Array, Float32Array]] = []

    def load(self) -> None:
        """Read the layers' weights and biases (``w0``, ``b0``, ``w1``, ...).

        Raises:
            ValueError: the file's layers do not chain from 64 inputs to 10 outputs.
        """
        path = Path(self.options.get("weights", Path(__file__).with_name(WEIGHTS_FILE)))
        layers: list[tuple[Float32Array, Float32Array]] = []
        with np.load(path) as data:
            for i in range(len(data.files) // 2):
                weight = np.ascontiguousarray(data[f"w{i}"], dtype=np.float32)
                bias = np.ascontiguousarray(data[f"b{i}"], dtype=np.float32)
                layers.append((weight, bias))
        widths = [64] + [w.shape[1] for w, _ in layers]
        chained = all(
            w.shape == (widths[i], widths[i + 1]) and b.shape == (widths[i + 1],)
            for i, (w, b) in enumerate(layers)
        )
        if not layers or not chained or widths[-1] != 10:
            raise ValueError(f"{path}: layers do not map 64 pixels to 10 classes")
        self._layers = layers

    def predict(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> Outputs:
        """Return class probabilities for a batch of raw-intensity images.

        Raises:
            RuntimeError: :meth:`load` has not run.
        """
        if not self._layers:
            raise RuntimeError("Digits.predict called before load()")
        # Request arrays are read-only shared memory: this product is a fresh array.
        activations: Float32Array = np.asarray(inputs["pixels"], dtype=np.float32) * PIXEL_SCALE
        *hidden, (last_weight, last_bias) = self._layers
        for weight, bias in hidden:
            activations = np.maximum(activations @ weight + bias, np.float32(0.0))
        logits = activations @ last_weight + last_bias
        # Subtracting each row's max keeps exp() from overflowing on confident rows.
        logits -= logits.max(axis=1, keepdims=True)
        exps = np.exp(logits)
        probabilities: Float32Array = exps / exps.sum(axis=1, keepdims=True)
        return {"probabilities": probabilities}
