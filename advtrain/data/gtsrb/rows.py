"""GTSRB's rows: the CSVs checked row by row, PPM images decoded (Pillow;
TensorFlow cannot read PPM), cropped and resized into PNG records; corrupt
rows refused or, under `on_corrupt="skip"`, counted and skipped.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import NamedTuple, Optional

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image, UnidentifiedImageError

from advtrain.data.errors import DataError, warn_skipped
from advtrain.utils.errors import one_line

logger = logging.getLogger(__name__)

NUM_CLASSES = 43

CSV_HEADER = tuple(
    "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId".split(";")
)
_KEEP_MESSAGES = 20  # skipped examples named in the dataset's metadata.json


class _Problems:
    # Raises on the first problem, or (skip) logs each and records the count
    # in the dataset's metadata after each split (`count`).

    def __init__(self, on_corrupt: str, info: tfds.core.DatasetInfo):
        self.on_corrupt, self.info = on_corrupt, info
        self.messages: list[str] = []

    def report(self, message: str) -> None:
        if self.on_corrupt != "skip":
            raise DataError(message)
        self.messages.append(message)
        logger.warning("gtsrb: skipping example: %s", message)

    def count(self, split: str, examples: Iterator) -> Iterator:
        before = len(self.messages)
        yield from examples
        self.info.metadata["skipped"] = len(self.messages)
        self.info.metadata["skipped_examples"] = self.messages[:_KEEP_MESSAGES]
        warn_skipped(logger, f"gtsrb {split}", len(self.messages) - before)


def open_ppm(data: bytes, name: str = "image") -> Image.Image:
    """Decodes a binary PPM (P6) into a loaded RGB image, samples scaled to 8
    bits; anything but a complete P6 image is a one-line `DataError`."""
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


def _read_csv(tree, rel: str) -> list[tuple[int, str]]:
    # (row, line) per data line; row 1 is the line after the header.
    name = tree.name(rel)
    try:
        raw = tree.read(rel)
    except OSError as exc:
        raise DataError(f"{name}: cannot read CSV ({one_line(exc)}).") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    lines = text.splitlines()
    header = lines[0].strip() if lines else ""
    if tuple(header.split(";")) != CSV_HEADER:
        raise DataError(
            f"{name}: expected the header {';'.join(CSV_HEADER)}. "
            f"Received: {header[:100]!r}"
        )
    return [(n, line.strip()) for n, line in enumerate(lines[1:], 1) if line.strip()]


# Uncompressed: Pillow's zlib would make preparing slower (docs/data.md);
# the records take about 1.4x the disk and are read once per run.
_PNG_OPTIONS = {"compress_level": 0}


def _encode_png(image: Image.Image) -> bytes:
    # Pillow, in C: TFDS's TensorFlow call per image costs more.
    out = io.BytesIO()
    image.save(out, format="PNG", **_PNG_OPTIONS)
    return out.getvalue()


class _Row(NamedTuple):
    filename: str
    width: int
    height: int
    roi: tuple[int, int, int, int]  # x1, y1, x2, y2; x2 and y2 exclusive
    label: int
    track: int  # -1 where the file name carries none (the test split)


def _parse_row(where: str, line: str, expected_class: Optional[int]) -> _Row:
    """One CSV line as a `_Row`, its fields and names checked."""
    filename, *fields = line.split(";")
    try:
        width, height, x1, y1, x2, y2, label = (int(v) for v in fields)
    except ValueError:
        raise DataError(
            f"{where}: expected {len(CSV_HEADER)} ';'-separated fields "
            f"with integers after Filename. Received: {line[:100]!r}"
        ) from None
    track = -1
    if expected_class is not None:
        stem = filename.rsplit(".", 1)[0].split("_")
        if len(stem) != 2 or not all(s.isdigit() for s in stem):
            raise DataError(
                f"{where}: expected a file named XXXXX_YYYYY.ppm "
                f"(track_frame). Received: {filename}"
            )
        track = int(stem[0])
    if not 0 <= label < NUM_CLASSES:
        raise DataError(
            f"{where}: ClassId out of range: expected "
            f"0..{NUM_CLASSES - 1}. Received: {label}"
        )
    if expected_class is not None and label != expected_class:
        raise DataError(
            f"{where}: ClassId {label} does not match its folder: "
            f"expected {expected_class}."
        )
    return _Row(filename, width, height, (x1, y1, x2, y2), label, track)


def _read_image(tree, rel: str, where: str, row: _Row) -> Image.Image:
    """The row's PPM, decoded, of the CSV's size and holding its ROI."""
    if not tree.is_file(rel):
        raise DataError(f"{where}: file {row.filename} not found")
    try:
        data = tree.read(rel)
    except OSError as exc:
        raise DataError(f"{tree.name(rel)}: cannot read ({one_line(exc)}).") from None
    image = open_ppm(data, tree.name(rel))
    width, height = row.width, row.height
    if image.size != (width, height):
        raise DataError(
            f"{where}: {row.filename} is {image.size[0]}x{image.size[1]}"
            f" (width x height), the CSV says {width}x{height}."
        )
    x1, y1, x2, y2 = row.roi
    if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
        raise DataError(
            f"{where}: ROI ({x1}, {y1}, {x2}, {y2}) is not inside the "
            f"{width}x{height} image."
        )
    return image


def _shaped(image: Image.Image, roi: tuple[int, ...], cfg) -> Image.Image:
    """`image` cropped to `roi` (`cfg.roi_crop`) and resized to
    `cfg.image_size` (height, width)."""
    if cfg.roi_crop:
        # x2 / y2 are exclusive: this leaves the sign's documented
        # border of at least 5 px outside the crop on every side.
        image = image.crop(roi)
    size = None if cfg.image_size is None else cfg.image_size[::-1]
    if size is not None and image.size != size:
        # Pillow widens its bilinear filter by the shrink factor, as
        # tf.image.resize(antialias=True) does: within 1 of 255.
        image = image.resize(size, Image.Resampling.BILINEAR)
    return image


def _examples(
    tree,
    folder: str,
    csv_tree,
    csv_rel: str,
    cfg,
    problems: _Problems,
    expected_class: Optional[int],
) -> Iterator[tuple[str, dict]]:
    csv_name = csv_tree.name(csv_rel)
    for n, line in _read_csv(csv_tree, csv_rel):
        where = f"{csv_name} row {n}"
        try:
            row = _parse_row(where, line, expected_class)
            rel = f"{folder}/{row.filename}"
            image = _read_image(tree, rel, where, row)
        except DataError as exc:
            problems.report(str(exc))
            continue
        yield (
            rel,
            {
                "image": _encode_png(_shaped(image, row.roi, cfg)),
                "label": row.label,
                "track": row.track,
                "roi": np.array(row.roi, np.int32),
                "filename": rel,
            },
        )
