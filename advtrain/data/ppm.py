"""Binary PPM (P6) reading with Pillow; TensorFlow's decoders do not read it.

GTSRB ships its images as P6 files. Pillow decodes them in C, one call per
image and no TensorFlow dispatch; this module only turns its exceptions
into one-line errors that name the file.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from advtrain.data.errors import DataError
from advtrain.utils.errors import one_line


def open_ppm(data: bytes, name: str = "image") -> Image.Image:
    """Decodes a binary PPM (P6) into a loaded RGB `PIL.Image.Image`.

    Samples are scaled to 8 bits when maxval is not 255 (16-bit files
    included).

    Args:
        data: the file's bytes.
        name: how errors name the file.

    Raises:
        DataError: one line naming the file, for anything but a complete
            P6 image.

    Example:

    ```python
    image = open_ppm(open("00000_00000.ppm", "rb").read())
    width, height = image.size
    ```
    """
    if data[:2] != b"P6":
        raise DataError(
            f"{name}: not a binary PPM: expected magic 'P6'. Received: {data[:2]!r}"
        )
    try:
        image = Image.open(io.BytesIO(data), formats=["PPM"])
        image.load()
    except UnidentifiedImageError:
        raise DataError(
            f"{name}: bad PPM header: expected 'P6 width height maxval' with "
            f"width, height >= 1. Received: {data[:32]!r}"
        ) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise DataError(
            f"{name}: truncated or bad PPM: expected a complete P6 image. "
            f"Received: {one_line(exc)}"
        ) from None
    return image


def decode_ppm(data: bytes, name: str = "image") -> np.ndarray:
    """Decodes a binary PPM (P6) into a `(H, W, 3)` uint8 array.

    Raises:
        DataError: as `open_ppm`.

    Example:

    ```python
    pixels = decode_ppm(open("00000_00000.ppm", "rb").read())
    ```
    """
    return np.array(open_ppm(data, name))
