"""Train the ``digits`` demo model; write its weights, held-out split and exports.

Needs scikit-learn, onnx and torch, which the appliance itself does not
depend on, so run it from a scratch environment at the repository root::

    python3 -m venv /tmp/venv-train
    /tmp/venv-train/bin/pip install scikit-learn numpy onnx onnxruntime torch==2.13.0
    /tmp/venv-train/bin/python tools/train_digits.py

It writes ``appliance/demos/digits_weights.npz`` (float32 ``w0``, ``b0``, ...
per layer) and ``tests/data/digits_holdout.npz`` (``X`` uint8 [n, 64] raw
0..16 pixels, ``y`` int64 [n]). The split and the training are seeded: a
rerun with the same library versions reproduces the same files.

It then exports the same network, from the written weights, into the example
model repository (``appliance/demos/repository``): ``digits_onnx/1/model.onnx``
(built with onnx's graph helpers, opset 17) and ``digits_torch/1/model.pt``
(``torch.jit.script``) with the ``config.toml`` that declares its tensors.
Both take raw 0..16 pixels and return softmax probabilities, as the numpy
demo does. ``--export-only`` skips training and exports the committed weights.
Every output is committed, so serving and the tests need no training tools.

The accuracies it prints are measured by loading the written files into the
served models (:class:`appliance.demos.digits.Digits` and the ONNX and
TorchScript runtimes), so they check exactly the forward passes that serving
runs; the script also checks that the three agree on every held-out image
(same predicted class, probabilities within ``--tolerance``). It fails if an
accuracy is below ``--min-accuracy`` or the runtimes disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WEIGHTS = REPO_ROOT / "appliance" / "demos" / "digits_weights.npz"
DEFAULT_HOLDOUT = REPO_ROOT / "tests" / "data" / "digits_holdout.npz"
DEFAULT_REPOSITORY = REPO_ROOT / "appliance" / "demos" / "repository"
PIXEL_MAX = 16.0
# ONNX Runtime 1.20 (the [onnx] extra's floor) reads IR version 10 and opset 21.
ONNX_OPSET = 17
ONNX_IR_VERSION = 8
TORCH_CONFIG = """\
# The TorchScript digits classifier: a TorchScript file does not carry its
# tensors' names, dtypes and shapes, so they are declared here. Shapes are
# whole shapes; the free (-1) first dimension on every tensor makes the model
# batched. Written by tools/train_digits.py.
max_batch_size = 64

[[inputs]]
name = "pixels"
dtype = "FP32"
shape = [-1, 64]

[[outputs]]
name = "probabilities"
dtype = "FP32"
shape = [-1, 10]
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights-out", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--holdout-out", type=Path, default=DEFAULT_HOLDOUT)
    parser.add_argument(
        "--hidden",
        type=int,
        nargs="+",
        default=[64, 64],
        help="hidden layer widths (default: 64 64)",
    )
    parser.add_argument("--test-size", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-iter", type=int, default=1000)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    parser.add_argument("--repository-out", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument(
        "--export-only",
        action="store_true",
        help="skip training: export the weights in --weights-out as they are",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        help="largest difference allowed between the runtimes' probabilities",
    )
    return parser.parse_args(argv)


def train(
    x_train: npt.NDArray[np.float64],
    y_train: npt.NDArray[np.int64],
    hidden: list[int],
    seed: int,
    max_iter: int,
) -> MLPClassifier:
    model = MLPClassifier(
        hidden_layer_sizes=tuple(hidden),
        activation="relu",
        max_iter=max_iter,
        random_state=seed,
    )
    model.fit(x_train / PIXEL_MAX, y_train)
    return model


def save_weights(model: MLPClassifier, path: Path) -> None:
    # Any, not NDArray: numpy's stub checks a **dict against savez's allow_pickle: bool too.
    arrays: dict[str, Any] = {}
    for i, (weight, bias) in enumerate(zip(model.coefs_, model.intercepts_, strict=True)):
        arrays[f"w{i}"] = np.asarray(weight, dtype=np.float32)
        arrays[f"b{i}"] = np.asarray(bias, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def read_layers(path: Path) -> list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
    """Read (weight [in, out], bias [out]) per layer, as the numpy demo does."""
    with np.load(path) as data:
        return [
            (data[f"w{i}"].astype(np.float32), data[f"b{i}"].astype(np.float32))
            for i in range(len(data.files) // 2)
        ]


def export_onnx(weights: Path, path: Path) -> None:
    """Write the network as ONNX: scale, MatMul + Add (+ Relu) per layer, Softmax."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    layers = read_layers(weights)
    scale = np.array(1.0 / PIXEL_MAX, dtype=np.float32)
    initializers = [numpy_helper.from_array(scale, "scale")]
    nodes = [helper.make_node("Mul", ["pixels", "scale"], ["x0"])]
    for i, (weight, bias) in enumerate(layers):
        initializers += [
            numpy_helper.from_array(weight, f"w{i}"),
            numpy_helper.from_array(bias, f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        ]
        last = i == len(layers) - 1
        nodes.append(
            helper.make_node("Softmax", [f"a{i}"], ["probabilities"], axis=1)
            if last
            else helper.make_node("Relu", [f"a{i}"], [f"x{i + 1}"])
        )
    width_in, width_out = layers[0][0].shape[0], layers[-1][0].shape[1]
    graph = helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", width_in])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", width_out])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        producer_name="tools/train_digits.py",
        doc_string="MLP classifier for 8x8 digit images (raw 0..16 pixels)",
    )
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def export_torchscript(weights: Path, path: Path) -> None:
    """Write the network as a scripted torch module, its config.toml beside its versions."""
    import torch

    class DigitsMLP(torch.nn.Module):
        def __init__(self, layers: list[tuple[Any, Any]]) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList()
            for weight, bias in layers:
                linear = torch.nn.Linear(weight.shape[0], weight.shape[1])
                linear.weight.data = torch.from_numpy(np.ascontiguousarray(weight.T))
                linear.bias.data = torch.from_numpy(bias)
                self.layers.append(linear)

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            x = pixels * (1.0 / 16.0)
            count = len(self.layers)
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < count - 1:
                    x = torch.relu(x)
            return torch.softmax(x, dim=1)

    module = torch.jit.script(DigitsMLP(read_layers(weights)).eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    module.save(str(path))
    (path.parents[1] / "config.toml").write_text(TORCH_CONFIG)


def served_probabilities(
    repository: Path, weights: Path, x: npt.NDArray[np.uint8]
) -> dict[str, npt.NDArray[np.float32]]:
    """Run the held-out images through the three served models."""
    # Imported here because the repository root joins sys.path only at run time.
    from appliance.demos.digits import Digits
    from appliance.formats.repository import scan
    from appliance.runtimes.onnx import OnnxModel
    from appliance.runtimes.torchscript import TorchScriptModel

    # The runtimes get their options as serving does: from the repository scan.
    entries = {entry["name"]: entry["options"] for entry in scan(repository)}
    models = {
        "numpy": Digits({"weights": str(weights)}),
        "onnx": OnnxModel(entries["digits_onnx"]),
        "torchscript": TorchScriptModel(entries["digits_torch"]),
    }
    pixels = x.astype(np.float32)
    pixels.flags.writeable = False
    results = {}
    for name, model in models.items():
        model.load()
        results[name] = np.asarray(model.predict({"pixels": pixels}, {})["probabilities"])
    return results


def check_runtimes(
    args: argparse.Namespace, x: npt.NDArray[np.uint8], y: npt.NDArray[np.int64]
) -> bool:
    """Print each runtime's accuracy; return True when all pass and agree."""
    results = served_probabilities(args.repository_out, args.weights_out, x)
    reference = results["numpy"]
    good = True
    for name, probabilities in results.items():
        accuracy = float(np.mean(probabilities.argmax(axis=1) == y))
        same = bool(np.array_equal(probabilities.argmax(axis=1), reference.argmax(axis=1)))
        diff = float(np.abs(probabilities - reference).max())
        print(
            f"held-out accuracy ({len(y)} samples, served {name}): {accuracy:.4f}; "
            f"same classes as numpy: {same}; largest probability difference {diff:.2e}"
        )
        good = good and accuracy >= args.min_accuracy and same and diff <= args.tolerance
    return good


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    if not args.export_only:
        train_and_save(args)
    with np.load(args.holdout_out) as data:
        holdout_x, holdout_y = data["X"], data["y"]
    export_onnx(args.weights_out, args.repository_out / "digits_onnx" / "1" / "model.onnx")
    export_torchscript(args.weights_out, args.repository_out / "digits_torch" / "1" / "model.pt")
    print(f"exported: {args.repository_out}/digits_onnx/1/model.onnx, digits_torch/1/model.pt")
    if not check_runtimes(args, holdout_x, holdout_y):
        print(
            f"error: accuracy below {args.min_accuracy}, or the runtimes disagree "
            f"(beyond {args.tolerance})",
            file=sys.stderr,
        )
        return 1
    return 0


def train_and_save(args: argparse.Namespace) -> None:
    """Train, write the weights and the held-out split, print what was trained."""
    digits = load_digits()
    x_all = digits.data.astype(np.float64)
    y_all = digits.target.astype(np.int64)
    x_train, x_holdout, y_train, y_holdout = train_test_split(
        x_all, y_all, test_size=args.test_size, stratify=y_all, random_state=args.seed
    )

    model = train(x_train, y_train, args.hidden, args.seed, args.max_iter)
    save_weights(model, args.weights_out)

    holdout_x = x_holdout.astype(np.uint8)
    holdout_y = np.asarray(y_holdout, dtype=np.int64)
    args.holdout_out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.holdout_out, X=holdout_x, y=holdout_y)

    layers = " -> ".join(str(n) for n in [x_all.shape[1], *args.hidden, len(digits.target_names)])
    print(f"architecture: {layers} (relu hidden, softmax output)")
    print(f"trained on {len(y_train)} samples for {model.n_iter_} iterations")
    print(f"weights: {args.weights_out} ({args.weights_out.stat().st_size} bytes)")
    print(f"holdout: {args.holdout_out} ({args.holdout_out.stat().st_size} bytes)")


if __name__ == "__main__":
    sys.exit(main())
