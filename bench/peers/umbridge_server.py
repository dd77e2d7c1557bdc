"""UM-Bridge's own Python server (``umbridge.serve_models``) with the benchmark's models.

Runs in bench/.peers/umbridge, never in the appliance's environment. Serves
``umb_identity_<label>`` (a vector of a fixed size, returned as sent) for
each ``label=size`` argument, and ``digits`` (64 pixels in, 10 class
probabilities out) computed with numpy from the appliance's committed
weights, as appliance/demos/digits.py does. Usage::

    python umbridge_server.py PORT WEIGHTS.npz 16B=4 16KiB=4096 ...
"""

from __future__ import annotations

import sys

import aiohttp.web
import numpy as np
import umbridge

PIXEL_SCALE = np.float32(1.0 / 16.0)


class Identity(umbridge.Model):
    def __init__(self, name: str, size: int) -> None:
        super().__init__(name)
        self.size = size

    def get_input_sizes(self, config):
        return [self.size]

    def get_output_sizes(self, config):
        return [self.size]

    def __call__(self, parameters, config):
        return [parameters[0]]

    def supports_evaluate(self):
        return True


class Digits(umbridge.Model):
    def __init__(self, weights: str) -> None:
        super().__init__("digits")
        with np.load(weights) as data:
            count = len(data.files) // 2
            self.layers = [
                (data[f"w{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32))
                for i in range(count)
            ]

    def get_input_sizes(self, config):
        return [64]

    def get_output_sizes(self, config):
        return [10]

    def __call__(self, parameters, config):
        activations = np.asarray(parameters, dtype=np.float32) * PIXEL_SCALE
        *hidden, (last_weight, last_bias) = self.layers
        for weight, bias in hidden:
            activations = np.maximum(activations @ weight + bias, np.float32(0.0))
        logits = activations @ last_weight + last_bias
        logits -= logits.max(axis=1, keepdims=True)
        exps = np.exp(logits)
        return [(exps / exps.sum(axis=1, keepdims=True))[0].tolist()]

    def supports_evaluate(self):
        return True


def main() -> None:
    port, weights, *sizes = sys.argv[1:]
    models: list[umbridge.Model] = [Digits(weights)]
    for item in sizes:
        label, size = item.split("=")
        models.append(Identity(f"umb_identity_{label}", int(size)))
    # serve_models binds every interface; the benchmark talks over loopback only.
    run_app = aiohttp.web.run_app
    aiohttp.web.run_app = lambda app, **kwargs: run_app(app, host="127.0.0.1", **kwargs)
    umbridge.serve_models(models, int(port))


if __name__ == "__main__":
    main()
