"""Train the ``digits`` demo model and write its weights and held-out split.

Needs scikit-learn, which the appliance itself does not depend on, so run it
from a scratch environment at the repository root::

    python3 -m venv /tmp/venv-train
    /tmp/venv-train/bin/pip install scikit-learn numpy
    /tmp/venv-train/bin/python tools/train_digits.py

It writes ``appliance/demos/digits_weights.npz`` (float32 ``w0``, ``b0``, ...
per layer) and ``tests/data/digits_holdout.npz`` (``X`` uint8 [n, 64] raw
0..16 pixels, ``y`` int64 [n]). Both outputs are committed, so serving and
the test suite need only numpy. The split and the training are seeded: a
rerun with the same library versions reproduces the same files.

The accuracy it prints is measured by loading the written weights into the
served :class:`appliance.demos.digits.Digits` model, so it checks exactly
the forward pass that serving runs. The script fails if that accuracy is
below ``--min-accuracy``.
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
PIXEL_MAX = 16.0


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


def served_accuracy(weights: Path, x: npt.NDArray[np.uint8], y: npt.NDArray[np.int64]) -> float:
    # Imported here because the repository root joins sys.path only at run time.
    from appliance.demos.digits import Digits

    model = Digits({"weights": str(weights)})
    model.load()
    pixels = x.astype(np.float32)
    pixels.flags.writeable = False
    probabilities = np.asarray(model.predict({"pixels": pixels}, {})["probabilities"])
    return float(np.mean(probabilities.argmax(axis=1) == y))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))

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

    accuracy = served_accuracy(args.weights_out, holdout_x, holdout_y)
    layers = " -> ".join(str(n) for n in [x_all.shape[1], *args.hidden, len(digits.target_names)])
    print(f"architecture: {layers} (relu hidden, softmax output)")
    print(f"trained on {len(y_train)} samples for {model.n_iter_} iterations")
    print(f"held-out accuracy ({len(holdout_y)} samples, served forward pass): {accuracy:.4f}")
    print(f"weights: {args.weights_out} ({args.weights_out.stat().st_size} bytes)")
    print(f"holdout: {args.holdout_out} ({args.holdout_out.stat().st_size} bytes)")
    if accuracy < args.min_accuracy:
        print(f"error: accuracy below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
