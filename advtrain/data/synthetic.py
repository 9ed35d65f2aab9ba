"""Small data sets in the real on-disk formats (GTSRB's PPM tree and zips,
MNIST's IDX files, a class-per-folder PNG tree), read by the sources as the
published data is; each writer returns what it wrote, for comparison.

Example:

```python
written = write_gtsrb(tmp_dir, classes=(0, 3), tracks_per_class=2)
splits = load_splits("gtsrb", path=str(tmp_dir), image_size=(32, 32))
```
"""

from __future__ import annotations

import dataclasses
import gzip
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Union

import numpy as np

_HEADER = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"


def encode_ppm(image: np.ndarray, comment: Optional[str] = None) -> bytes:
    """Encodes a `(H, W, 3)` uint8 array as binary PPM (P6, maxval 255)."""
    image = np.asarray(image, np.uint8)
    height, width = image.shape[:2]
    note = f"# {comment}\n" if comment else ""
    header = f"P6\n{note}{width} {height}\n255\n".encode("ascii")
    return header + image.tobytes()


@dataclasses.dataclass
class GtsrbImage:
    """One written GTSRB image, as the CSV describes it."""

    split: str
    path: str  # relative to the root, e.g. GTSRB/Final_Test/Images/00000.ppm
    label: int
    track: int  # -1 for test images
    roi: tuple[int, int, int, int]  # x1, y1, x2, y2
    image: np.ndarray


def _smooth_image(rng, height: int, width: int) -> np.ndarray:
    # Blocks of colour plus a little noise: compresses roughly like a photo.
    grid = rng.integers(0, 256, (5, 5, 3), dtype=np.int16)
    field = grid[np.arange(height) * 5 // height][:, np.arange(width) * 5 // width]
    field += rng.integers(-8, 9, field.shape, dtype=np.int16)
    return np.clip(field, 0, 255).astype(np.uint8)


def _gtsrb_image(rng, size: int, pattern: str):
    width = int(np.clip(size + rng.integers(-size // 10, size // 10 + 1), 15, 250))
    height = int(np.clip(size, 15, 250))
    if pattern == "noise":
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    else:
        image = _smooth_image(rng, height, width)
    # The sign sits inside a border of 10 % of its size, at least 5 px; the
    # ROI's x2 / y2 are exclusive (a numpy slice).
    bx = max(5, int(round(width * 0.08)))
    by = max(5, int(round(height * 0.08)))
    x1 = int(rng.integers(max(1, bx - 2), bx + 1))
    y1 = int(rng.integers(max(1, by - 2), by + 1))
    roi = (x1, y1, width - bx, height - by)
    return image, roi


def write_gtsrb(
    root: Union[str, Path],
    *,
    classes: Sequence[int] = (0, 1, 2),
    tracks_per_class: int = 2,
    frames_per_track: int = 3,
    test_per_class: int = 2,
    sizes: tuple[int, int] = (15, 64),
    pattern: str = "noise",
    archives: bool = False,
    extracted: bool = True,
    seed: int = 0,
) -> list[GtsrbImage]:
    """Writes a GTSRB tree in the official layout; returns its images.

    Training images go to `GTSRB/Final_Training/Images/000NN/XXXXX_YYYYY.ppm`
    (track XXXXX, frame YYYYY, growing like an approaching sign) with
    `GT-000NN.csv`; test images to `GTSRB/Final_Test/Images/NNNNN.ppm` with
    an unlabelled CSV beside them and `GT-final_test.csv` at the root, as
    the three official archives unzip (`archives=True` writes those zips,
    `extracted=False` skips the folders). `sizes` bounds the image side
    (GTSRB: 15..250); `pattern` is "noise" or "smooth" (photo-like).
    """
    rng = np.random.default_rng(seed)
    lo, hi = sizes
    files: dict[str, bytes] = {}
    written: list[GtsrbImage] = []

    def add(split, folder, name, size, cls, track, comment=None):
        image, roi = _gtsrb_image(rng, size, pattern)
        files[f"{folder}/{name}"] = encode_ppm(image, comment)
        written.append(GtsrbImage(split, f"{folder}/{name}", cls, track, roi, image))
        height, width = image.shape[:2]
        return ";".join(str(v) for v in (name, width, height, *roi, cls))

    for cls in classes:
        folder = f"GTSRB/Final_Training/Images/{cls:05d}"
        rows = [_HEADER]
        for track in range(tracks_per_class):
            # Like the real tracks: the last frame's size is log-uniform
            # (most signs stay small), the first is 2.5x smaller.
            end = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            start = max(lo, end / 2.5)
            step = (end - start) / max(1, frames_per_track - 1)
            for frame in range(frames_per_track):
                name = f"{track:05d}_{frame:05d}.ppm"
                size = int(round(start + step * frame))
                rows.append(add("train", folder, name, size, cls, track))
        files[f"{folder}/GT-{cls:05d}.csv"] = _csv(rows)
    test_rows, gt_rows = [_HEADER.rsplit(";", 1)[0]], [_HEADER]
    folder = "GTSRB/Final_Test/Images"
    for i in range(test_per_class * len(classes)):
        cls, size = classes[i % len(classes)], int(rng.integers(lo, hi + 1))
        row = add("test", folder, f"{i:05d}.ppm", size, cls, -1, "written by advtrain")
        gt_rows.append(row)
        test_rows.append(row.rsplit(";", 1)[0])
    files[f"{folder}/GT-final_test.test.csv"] = _csv(test_rows)
    gt_csv = _csv(gt_rows)
    root = Path(root)
    if extracted:
        for rel, data in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (root / "GT-final_test.csv").write_bytes(gt_csv)
    if archives:
        root.mkdir(parents=True, exist_ok=True)
        train = {k: v for k, v in files.items() if "Final_Training" in k}
        test = {k: v for k, v in files.items() if "Final_Test" in k}
        _write_zip(root / "GTSRB_Final_Training_Images.zip", train)
        _write_zip(root / "GTSRB_Final_Test_Images.zip", test)
        _write_zip(root / "GTSRB_Final_Test_GT.zip", {"GT-final_test.csv": gt_csv})
    return written


def _csv(rows: list[str]) -> bytes:
    return ("\r\n".join(rows) + "\r\n").encode("ascii")


def _write_zip(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for rel, data in sorted(files.items()):
            zf.writestr(rel, data)


def write_idx(path: Union[str, Path], array: np.ndarray) -> None:
    """Writes a uint8 array in IDX format (gzipped when the name ends .gz)."""
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    data = header + array.tobytes()
    path = Path(path)
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=1)
    path.write_bytes(data)


def write_mnist(
    directory: Union[str, Path],
    *,
    n_train: int = 20,
    n_test: int = 10,
    gz: bool = True,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writes MNIST-format IDX files; returns {"train"/"test": (x, y)}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    suffix = ".gz" if gz else ""
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(y)
        write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", x)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", y)
        out[split] = (x, y)
    return out


def write_image_folder(
    root: Union[str, Path],
    *,
    classes: Sequence[str] = ("cat", "dog"),
    per_class: int = 3,
    size: tuple[int, int] = (12, 10),
    channels: int = 3,
    split_dirs: Sequence[str] = ("train", "test"),
    seed: int = 0,
) -> dict[str, list[tuple[str, int, np.ndarray]]]:
    """Writes `root/<split>/<class>/<i>.png`; `split_dirs=()` writes one tree.

    Returns {split or "all": [(relative path, label, pixels), ...]}.
    """
    import tensorflow as tf

    root = Path(root)
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[str, int, np.ndarray]]] = {}
    for split in list(split_dirs) or [""]:
        entries = out.setdefault(split or "all", [])
        for label, name in enumerate(sorted(classes)):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = rng.integers(0, 256, (*size, channels), dtype=np.uint8)
                path = folder / f"{i:03d}.png"
                path.write_bytes(tf.io.encode_png(image).numpy())
                entries.append((str(path.relative_to(root)), label, image))
    return out
