"""Binary PPM (P6) decoding with numpy; TensorFlow's decoders do not read it.

GTSRB ships its images as P6 files. The header is `P6`, width, height and
maxval as ASCII integers separated by whitespace, with `#` comments allowed
between tokens, then exactly one whitespace byte and `height * width * 3`
bytes of RGB (one byte per sample when maxval < 256).
"""

from __future__ import annotations

import numpy as np

from advtrain.config import RecipeError

_WHITESPACE = b" \t\n\r\v\f"


def _header_tokens(data: bytes, name: str) -> tuple[list[bytes], int]:
    """Returns the four header tokens and the offset of the first pixel."""
    tokens: list[bytes] = []
    pos, end = 0, len(data)
    while len(tokens) < 4:
        while pos < end and data[pos] in _WHITESPACE:
            pos += 1
        if pos < end and data[pos] == ord("#"):
            while pos < end and data[pos] not in b"\n\r":
                pos += 1
            continue
        if pos >= end:
            raise RecipeError(
                f"{name}: truncated PPM header: expected 'P6 width height "
                f"maxval'. Received: {len(data)} bytes"
            )
        start = pos
        while pos < end and data[pos] not in _WHITESPACE and data[pos] != ord("#"):
            pos += 1
        tokens.append(data[start:pos])
    # A single whitespace byte separates maxval from the raster.
    if pos >= end or data[pos] not in _WHITESPACE:
        raise RecipeError(
            f"{name}: truncated PPM header: expected whitespace after maxval."
        )
    return tokens, pos + 1


def decode_ppm(data: bytes, name: str = "image") -> np.ndarray:
    """Decodes a binary PPM (P6, maxval 255) into a `(H, W, 3)` uint8 array.

    Args:
        data: the file's bytes.
        name: how errors name the file.

    Raises:
        RecipeError: one line naming the file, for anything but a complete
            P6 image with maxval 255.

    Example:

    ```python
    image = decode_ppm(open("00000_00000.ppm", "rb").read())
    ```
    """
    if data[:2] != b"P6":
        raise RecipeError(
            f"{name}: not a binary PPM: expected magic 'P6'. Received: {data[:2]!r}"
        )
    tokens, offset = _header_tokens(data, name)
    try:
        width, height, maxval = (int(t) for t in tokens[1:])
    except ValueError:
        raise RecipeError(
            f"{name}: bad PPM header: expected integers width height maxval. "
            f"Received: {b' '.join(tokens[1:])!r}"
        ) from None
    if width < 1 or height < 1:
        raise RecipeError(
            f"{name}: bad PPM size: expected width, height >= 1. "
            f"Received: {width}x{height}"
        )
    if maxval != 255:
        raise RecipeError(
            f"{name}: unsupported PPM maxval: expected 255. Received: {maxval}"
        )
    expected = width * height * 3
    available = len(data) - offset
    if available < expected:
        raise RecipeError(
            f"{name}: truncated PPM: expected {expected} pixel bytes for "
            f"{width}x{height} RGB. Received: {available}"
        )
    pixels = np.frombuffer(data, np.uint8, count=expected, offset=offset)
    return pixels.reshape(height, width, 3).copy()
