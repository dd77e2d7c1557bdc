"""IMAGE items: encoded image files <-> pixel arrays, with Pillow.

An IMAGE item is decoded into pixels only for a numeric input whose shape
(per batch element) looks like an image:

* ``[H, W]``: grey levels (Pillow mode L);
* ``[H, W, C]`` with C of 1, 3 or 4 (or -1, read as 3): channels last;
* ``[C, H, W]`` with C of 1, 3 or 4: channels first.

H and W may be -1 (any size); fixed ones must equal the image's size, as
nothing is resized. Images above MAX_PIXELS are refused from their header,
before they are decoded. Pixel values stay 0..255 in the input's dtype. A
UINT8 output row shaped like an image goes back as a PNG file.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.protocols.mip.codec import ErrorCode, MipError

Array = npt.NDArray[Any]
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# A small file can claim a huge image: 64 Mpx (256 MiB as RGBA) at most.
MAX_PIXELS = 64 * 1024 * 1024


def layout(shape: Sequence[int]) -> tuple[int, bool] | None:
    """Return (channels, channels_first) for an image-like shape, else None."""
    if len(shape) == 2:
        return 1, False
    if len(shape) != 3:
        return None
    if shape[2] in (1, 3, 4, -1):
        return (3 if shape[2] == -1 else shape[2]), False
    if shape[0] in (1, 3, 4):
        return shape[0], True
    return None


def decode_pixels(data: bytes, shape: Sequence[int], dtype: DType, where: str) -> Array:
    """Decode an image file into a row of ``shape`` and ``dtype``.

    Raises:
        MipError: SHAPE when the input is not image-like, the bytes are not an
            image Pillow reads, or the image's size does not fit.
    """
    found = layout(shape)
    if found is None or dtype in (DType.BOOL, DType.BYTES, DType.INT8):
        raise MipError(
            ErrorCode.SHAPE,
            f"{where}: an IMAGE item needs an image-like numeric input ([H, W], [H, W, C] "
            f"or [C, H, W]); this input is {dtype.value} {list(shape)}",
        )
    channels, first = found
    pixels = _read(data, _MODES[channels], shape[1:] if first else shape[:2], where)
    if channels == 1 and len(shape) == 3:
        pixels = pixels[:, :, np.newaxis]
    if first:
        pixels = np.moveaxis(pixels, 2, 0)
    if any(want not in (-1, got) for want, got in zip(shape, pixels.shape, strict=True)):
        raise MipError(
            ErrorCode.SHAPE,
            f"{where}: the image decodes to {list(pixels.shape)}; the input expects "
            f"{list(shape)} (images are not resized)",
        )
    return np.ascontiguousarray(pixels, dtype=dtypes.to_numpy(dtype))


def _read(data: bytes, mode: str, size: Sequence[int], where: str) -> Array:
    try:
        with warnings.catch_warnings():
            # A decompression bomb is refused, not merely warned about.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                _check_size(opened.size, size, where)
                return np.asarray(opened.convert(mode))
    except MipError:
        raise
    except Exception as ex:  # Pillow raises many kinds for bad files
        raise MipError(
            ErrorCode.SHAPE, f"{where}: the IMAGE item is not an image Pillow can read: {ex}"
        ) from None


def _check_size(found: tuple[int, int], size: Sequence[int], where: str) -> None:
    width, height = found
    if width * height > MAX_PIXELS or any(
        want not in (-1, got) for want, got in zip(size, (height, width), strict=True)
    ):
        raise MipError(
            ErrorCode.SHAPE,
            f"{where}: the image is {height} x {width} pixels; the input expects "
            f"{list(size)} (-1 = any, at most {MAX_PIXELS} pixels; images are not resized)",
        )


def is_pixels(row: Array) -> bool:
    """True for a UINT8 row shaped [H, W] or [H, W, C] with C of 1, 3 or 4."""
    if row.dtype != np.uint8 or row.ndim not in (2, 3) or 0 in row.shape:
        return False
    return row.ndim == 2 or row.shape[2] in (1, 3, 4)


def encode_png(row: Array) -> bytes:
    """Encode a UINT8 pixel row (see :func:`is_pixels`) as a PNG file."""
    pixels = row[:, :, 0] if row.ndim == 3 and row.shape[2] == 1 else row
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="PNG")
    return out.getvalue()
