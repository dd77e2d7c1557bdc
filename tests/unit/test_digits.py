"""The digits demo model: accuracy on the committed held-out split, and output shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from appliance.demos.digits import Digits

HOLDOUT = Path(__file__).resolve().parent.parent / "data" / "digits_holdout.npz"


@pytest.fixture(scope="module")
def model() -> Digits:
    digits = Digits({})
    digits.load()
    return digits


@pytest.fixture(scope="module")
def holdout() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    with np.load(HOLDOUT) as data:
        pixels = data["X"].astype(np.float32)
        labels = data["y"].astype(np.int64)
    # Served requests are read-only shared memory; the model must not write into them.
    pixels.flags.writeable = False
    return pixels, labels


def probabilities(model: Digits, pixels: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    out = model.predict({"pixels": pixels}, {})["probabilities"]
    assert isinstance(out, np.ndarray)
    return out


def test_holdout_accuracy(
    model: Digits, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    pixels, labels = holdout
    predicted = probabilities(model, pixels).argmax(axis=1)
    assert np.mean(predicted == labels) >= 0.95


def test_output_is_float32_distribution(
    model: Digits, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    pixels, _ = holdout
    out = probabilities(model, pixels)
    assert out.dtype == np.float32
    assert out.shape == (len(pixels), 10)
    assert np.all(out >= 0.0)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-5)


def test_single_row_matches_row_in_batch(
    model: Digits, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    pixels, _ = holdout
    batch = pixels[: Digits.max_batch_size]
    batched = probabilities(model, batch)
    for row in (0, 17, len(batch) - 1):
        single = probabilities(model, batch[row : row + 1])
        assert single.shape == (1, 10)
        # Not exact: BLAS may pick a different kernel for one row than for many.
        np.testing.assert_allclose(single[0], batched[row], rtol=1e-5, atol=1e-7)


def test_weights_option_file_is_loaded_and_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, w0=np.zeros((64, 5), np.float32), b0=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="10 classes"):
        Digits({"weights": str(bad)}).load()


def test_predict_before_load_fails() -> None:
    with pytest.raises(RuntimeError, match="before load"):
        Digits({}).predict({"pixels": np.zeros((1, 64), np.float32)}, {})
