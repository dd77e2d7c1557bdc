"""The two ends of ``digits_ensemble``: raw images in, a label out, ``digits`` between.

``digits_ensemble`` (appliance/demos/ensembles/digits_ensemble/config.pbtxt)
chains three served models:

    IMAGE UINT8 [-1,8,8] -> digits_preprocess -> pixels FP32 [-1,64]
                         -> digits            -> probabilities FP32 [-1,10]
                         -> digits_postprocess -> LABEL BYTES [-1,1]

Its pixels are the dataset's raw intensities (0..16, as tests/data holds them);
``digits`` was trained on those and scales them itself, so preprocessing
widens them to FP32 and flattens each image. Postprocessing takes the most
probable class and names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.model import Arrays, Model, Outputs, spec

__all__ = ["DigitsPostprocess", "DigitsPreprocess"]

DIGITS = tuple(str(digit) for digit in range(10))


class DigitsPreprocess(Model):
    """8x8 UINT8 images to the FP32 rows of 64 pixels ``digits`` reads.

    Option ``scale`` (1.0) multiplies the intensities on the way, for
    images in another range than the dataset's 0..16 (16/255 for 8-bit).
    """

    inputs = [spec("IMAGE", "UINT8", [-1, 8, 8])]
    outputs = [spec("PIXELS", "FP32", [-1, 64])]
    max_batch_size = 64
    description = "8x8 UINT8 images -> FP32 pixel rows for digits"

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        images = inputs["IMAGE"]
        pixels = images.reshape(images.shape[0], 64).astype(np.float32)
        scale = float(self.options.get("scale", 1.0))
        if scale != 1.0:
            pixels *= np.float32(scale)
        return {"PIXELS": pixels}


class DigitsPostprocess(Model):
    """Class probabilities to the name of the most probable class, as BYTES.

    Option ``labels`` (the digits "0".."9") names the classes in order.
    """

    inputs = [spec("PROBABILITIES", "FP32", [-1, 10])]
    outputs = [spec("LABEL", "BYTES", [-1, 1])]
    max_batch_size = 64
    description = "class probabilities -> the most probable class's label"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._labels = np.array([label.encode() for label in DIGITS], dtype=object)

    def load(self) -> None:
        """Check the labels option.

        Raises:
            ValueError: it is not ten strings.
        """
        labels = self.options.get("labels", DIGITS)
        if len(labels) != 10 or not all(isinstance(label, str) for label in labels):
            raise ValueError(f"option labels: expected 10 strings, got {labels!r}")
        self._labels = np.array([label.encode() for label in labels], dtype=object)

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        best = np.argmax(inputs["PROBABILITIES"], axis=1)
        return {"LABEL": self._labels[best].reshape(-1, 1)}
