"""GTSRB, the German Traffic Sign Recognition Benchmark, as a TFDS dataset.

Importing this module (or `advtrain`) registers the TFDS builder `gtsrb`
and the advtrain source `gtsrb`. The builder downloads the three official
archives when online (from a mirror with the same file names if
`$ADVTRAIN_GTSRB_URL` names one); otherwise it reads them, or the folders
they extract to, from the TFDS manual directory (the recipe's `data.path`).
With no manual directory and no network it stops within seconds, naming
these files:

```
GTSRB_Final_Training_Images.zip  or  GTSRB/Final_Training/Images/000NN/
GTSRB_Final_Test_Images.zip      or  GTSRB/Final_Test/Images/
GTSRB_Final_Test_GT.zip          or  GT-final_test.csv
```

Training images are `000NN/XXXXX_YYYYY.ppm` (class NN, track XXXXX, frame
YYYYY) listed in `000NN/GT-000NN.csv`; test labels are in
`GT-final_test.csv`. The CSVs are `;`-separated with the header
`Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId`. The PPM images
are decoded with Pillow at preparation time (TensorFlow cannot read PPM) and
stored as PNG records, optionally cropped to the ROI and resized; each
config (`full`, `roi`, `roi_32x32`, ...) is prepared once into its own
folder. Each training record keeps its track id, so a validation split can
hold out whole tracks: the 30 frames of a track are near-duplicates of one
physical sign, and a random split would leak them.

Example:

```python
import tensorflow_datasets as tfds
import advtrain  # registers "gtsrb"

ds = tfds.load(
    "gtsrb/roi_32x32",
    split="train",
    data_dir="/tmp/tfds",
    download_and_prepare_kwargs={
        "download_config": tfds.download.DownloadConfig(manual_dir="/data")
    },
)
```
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath
from PIL import Image

from advtrain.data.errors import DataError
from advtrain.data.pipeline import DataSplits
from advtrain.data.ppm import open_ppm
from advtrain.data.sources import register_source
from advtrain.data.splits import require
from advtrain.utils.downloads import check_reachable
from advtrain.utils.errors import one_line

logger = logging.getLogger(__name__)

URL = "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/"
# Names a mirror of the three archives (same file names) to download from.
URL_ENV = "ADVTRAIN_GTSRB_URL"
ARCHIVES = {
    "train": "GTSRB_Final_Training_Images.zip",
    "test": "GTSRB_Final_Test_Images.zip",
    "test_gt": "GTSRB_Final_Test_GT.zip",
}
TRAIN_DIR = "GTSRB/Final_Training/Images"
TEST_DIR = "GTSRB/Final_Test/Images"
TEST_GT = "GT-final_test.csv"
CSV_HEADER = (
    "Filename",
    "Width",
    "Height",
    "Roi.X1",
    "Roi.Y1",
    "Roi.X2",
    "Roi.Y2",
    "ClassId",
)
NUM_CLASSES = 43
CLASS_NAMES = [
    "speed limit 20",
    "speed limit 30",
    "speed limit 50",
    "speed limit 60",
    "speed limit 70",
    "speed limit 80",
    "end of speed limit 80",
    "speed limit 100",
    "speed limit 120",
    "no passing",
    "no passing for vehicles over 3.5 t",
    "right-of-way at next intersection",
    "priority road",
    "yield",
    "stop",
    "no vehicles",
    "vehicles over 3.5 t prohibited",
    "no entry",
    "general caution",
    "dangerous curve left",
    "dangerous curve right",
    "double curve",
    "bumpy road",
    "slippery road",
    "road narrows on the right",
    "road work",
    "traffic signals",
    "pedestrians",
    "children crossing",
    "bicycles crossing",
    "beware of ice or snow",
    "wild animals crossing",
    "end of all speed and passing limits",
    "turn right ahead",
    "turn left ahead",
    "ahead only",
    "go straight or right",
    "go straight or left",
    "keep right",
    "keep left",
    "roundabout mandatory",
    "end of no passing",
    "end of no passing by vehicles over 3.5 t",
]
# Skipped examples named in the prepared dataset's metadata.json.
_KEEP_MESSAGES = 20

_CITATION = """\
@article{Stallkamp2012,
  title   = {Man vs. computer: Benchmarking machine learning algorithms
             for traffic sign recognition},
  author  = {Stallkamp, J. and Schlipsing, M. and Salmen, J. and Igel, C.},
  journal = {Neural Networks},
  volume  = {32},
  pages   = {323--332},
  year    = {2012},
}"""


def archives_url() -> str:
    """Where the archives download from: $ADVTRAIN_GTSRB_URL, else `URL`."""
    url = os.environ.get(URL_ENV) or URL
    return url if url.endswith("/") else url + "/"


# ----------------------------------------------------------------- configs


@dataclasses.dataclass(eq=False)
class GtsrbConfig(tfds.core.BuilderConfig):
    """How the images are stored: ROI crop and fixed size (height, width).

    Make one with `gtsrb_config(roi_crop, image_size)`, which names it.
    """

    roi_crop: bool = False
    image_size: Optional[tuple[int, int]] = None


def _config_name(roi_crop: bool, image_size) -> str:
    name = "roi" if roi_crop else "full"
    if image_size is not None:
        name += f"_{int(image_size[0])}x{int(image_size[1])}"
    return name


def _make_config(roi_crop: bool, image_size) -> GtsrbConfig:
    size = None if image_size is None else tuple(int(s) for s in image_size)
    crop = "cropped to the sign's ROI" if roi_crop else "whole images"
    shape = f"resized to {size[0]}x{size[1]}" if size else "at native size"
    return GtsrbConfig(
        name=_config_name(roi_crop, size),
        description=f"GTSRB {crop}, {shape}.",
        roi_crop=roi_crop,
        image_size=size,
    )


def gtsrb_config(
    roi_crop: bool, image_size: Optional[tuple[int, int]] = None
) -> GtsrbConfig:
    """The builder config for these options (a predefined one if it exists)."""
    name = _config_name(roi_crop, image_size)
    predefined = Gtsrb.builder_configs.get(name)
    return predefined if predefined is not None else _make_config(roi_crop, image_size)


# ------------------------------------------------------- files and archives


class _FolderTree:
    """Files under a directory, addressed by '/'-separated relative paths."""

    def __init__(self, root: Path):
        self.root = root

    def name(self, rel: str) -> str:
        return rel

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def subdirs(self, rel: str) -> list[str]:
        return sorted(p.name for p in (self.root / rel).iterdir() if p.is_dir())

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()


class _ZipTree:
    """Members of a zip archive, read without extracting it."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
            names = self._zip.namelist()
        except (OSError, zipfile.BadZipFile) as exc:
            raise DataError(
                f"{path.name}: not a readable zip archive ({one_line(exc)})."
            ) from None
        self._files = {n for n in names if not n.endswith("/")}
        self._dirs: set[str] = set()
        for name in names:
            parts = name.rstrip("/").split("/")
            # A file's parents are folders; so is an explicit "dir/" entry.
            last = len(parts) + 1 if name.endswith("/") else len(parts)
            self._dirs.update("/".join(parts[:i]) for i in range(1, last))

    def name(self, rel: str) -> str:
        return f"{self.path.name}:{rel}"

    def is_file(self, rel: str) -> bool:
        return rel in self._files

    def is_dir(self, rel: str) -> bool:
        return rel in self._dirs

    def subdirs(self, rel: str) -> list[str]:
        prefix = rel.rstrip("/") + "/"
        return sorted(
            d[len(prefix) :]
            for d in self._dirs
            if d.startswith(prefix) and "/" not in d[len(prefix) :]
        )

    def read(self, rel: str) -> bytes:
        try:
            return self._zip.read(rel)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise OSError(f"corrupt archive member ({one_line(exc)})") from None


def _listing(root: Path, limit: int = 8) -> str:
    names = sorted(p.name for p in root.iterdir())
    shown = ", ".join(names[:limit]) or "nothing"
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


@dataclasses.dataclass
class _Layout:
    train: object
    test: object
    gt: object
    gt_rel: str


def _find_tree(root: Path, rel_dir: str, archive: str):
    if (root / rel_dir).is_dir():
        return _FolderTree(root)
    if (root / archive).is_file():
        tree = _ZipTree(root / archive)
        if not tree.is_dir(rel_dir):
            raise DataError(
                f"{archive}: expected the folder {rel_dir}/ inside "
                "(official GTSRB archive layout)."
            )
        return tree
    raise DataError(
        f"{root}: expected {rel_dir}/ or {archive} (official GTSRB layout). "
        f"Received: {_listing(root)}"
    )


def _find_gt(root: Path):
    for rel in (
        TEST_GT,
        f"GTSRB/{TEST_GT}",
        f"GTSRB/Final_Test/{TEST_GT}",
        f"{TEST_DIR}/{TEST_GT}",
    ):
        if (root / rel).is_file():
            return _FolderTree(root), rel
    if (root / ARCHIVES["test_gt"]).is_file():
        return _gt_in_zip(_ZipTree(root / ARCHIVES["test_gt"]))
    raise DataError(
        f"{root}: expected {TEST_GT} (test labels) or {ARCHIVES['test_gt']}. "
        f"Received: {_listing(root)}"
    )


def _gt_in_zip(tree: _ZipTree):
    for rel in sorted(tree._files):
        if rel.split("/")[-1] == TEST_GT:
            return tree, rel
    raise DataError(f"{tree.path.name}: expected {TEST_GT} inside.")


def locate_manual_dir(root: Path) -> _Layout:
    """Finds the train images, test images and test labels under `root`."""
    if not root.is_dir():
        raise DataError(
            f"{root}: GTSRB directory not found. Expected the official zips "
            "or their extracted GTSRB/ folder there (data.path)."
        )
    if root.name == "GTSRB" and (root / "Final_Training" / "Images").is_dir():
        root = root.parent
    train = _find_tree(root, TRAIN_DIR, ARCHIVES["train"])
    test = _find_tree(root, TEST_DIR, ARCHIVES["test"])
    gt, gt_rel = _find_gt(root)
    return _Layout(train=train, test=test, gt=gt, gt_rel=gt_rel)


def _locate_downloaded(paths: dict) -> _Layout:
    gt, gt_rel = _gt_in_zip(_ZipTree(Path(paths["test_gt"])))
    return _Layout(
        train=_ZipTree(Path(paths["train"])),
        test=_ZipTree(Path(paths["test"])),
        gt=gt,
        gt_rel=gt_rel,
    )


# ----------------------------------------------------------------- reading


class _Problems:
    """Raises on the first problem, or counts and logs them (skip mode)."""

    def __init__(self, on_corrupt: str):
        self.on_corrupt = on_corrupt
        self.messages: list[str] = []

    def report(self, message: str) -> None:
        if self.on_corrupt != "skip":
            raise DataError(message)
        self.messages.append(message)
        logger.warning("gtsrb: skipping example: %s", message)


def _read_csv(tree, rel: str) -> list[tuple[int, str]]:
    """Returns (row, line) per data line; row 1 is the line after the header."""
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


def _parse_row(csv_name: str, n: int, line: str):
    fields = line.split(";")
    try:
        if len(fields) != len(CSV_HEADER):
            raise ValueError
        values = [int(v) for v in fields[1:]]
    except ValueError:
        raise DataError(
            f"{csv_name} row {n}: expected {len(CSV_HEADER)} ';'-separated "
            f"fields with integers after Filename. Received: {line[:100]!r}"
        ) from None
    return fields[0], values


# Stored without zlib compression: Pillow's PNG encoder is slower than the
# numpy one it replaced when it compresses, and preparation should not be
# slower than before (scripts/bench_gtsrb_prepare). The records are read
# once per run, then cached decoded; they take about 1.4x the disk of
# compressed ones (zlib's run-length strategy, the fastest that compresses:
# 0.8x the old preparation speed at native size, 0.9x the old size).
_PNG_OPTIONS = {"compress_level": 0}


def _encode_png(image: Image.Image) -> bytes:
    # Pillow, in C: TFDS would encode each image with a TensorFlow call,
    # whose dispatch costs more than compressing a small sign.
    out = io.BytesIO()
    image.save(out, format="PNG", **_PNG_OPTIONS)
    return out.getvalue()


def _resize(image: Image.Image, size) -> Image.Image:
    # Pillow widens its bilinear filter by the shrink factor (antialias), as
    # tf.image.resize(antialias=True) does; results agree to +-1 of 255.
    height, width = int(size[0]), int(size[1])
    if image.size == (width, height):
        return image
    return image.resize((width, height), Image.Resampling.BILINEAR)


def _examples(
    tree,
    folder: str,
    csv_tree,
    csv_rel: str,
    cfg: GtsrbConfig,
    problems: _Problems,
    expected_class: Optional[int],
) -> Iterator[tuple[str, dict]]:
    csv_name = csv_tree.name(csv_rel)
    for n, line in _read_csv(csv_tree, csv_rel):
        try:
            filename, (width, height, x1, y1, x2, y2, label) = _parse_row(
                csv_name, n, line
            )
            where = f"{csv_name} row {n}"
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
            rel = f"{folder}/{filename}"
            if not tree.is_file(rel):
                raise DataError(f"{where}: file {filename} not found")
            try:
                data = tree.read(rel)
            except OSError as exc:
                raise DataError(
                    f"{tree.name(rel)}: cannot read ({one_line(exc)})."
                ) from None
            image = open_ppm(data, tree.name(rel))
            if image.size != (width, height):
                raise DataError(
                    f"{where}: {filename} is {image.size[0]}x{image.size[1]}"
                    f" (width x height), the CSV says {width}x{height}."
                )
            if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
                raise DataError(
                    f"{where}: ROI ({x1}, {y1}, {x2}, {y2}) is not inside the "
                    f"{width}x{height} image."
                )
        except DataError as exc:
            problems.report(str(exc))
            continue
        if cfg.roi_crop:
            # x2 / y2 are exclusive: this leaves the sign's documented
            # border of at least 5 px outside the crop on every side.
            image = image.crop((x1, y1, x2, y2))
        if cfg.image_size is not None:
            image = _resize(image, cfg.image_size)
        yield (
            rel,
            {
                "image": _encode_png(image),
                "label": label,
                "track": track,
                "roi": np.array([x1, y1, x2, y2], np.int32),
                "filename": rel,
            },
        )


def _train_examples(layout: _Layout, cfg, problems):
    tree = layout.train
    class_dirs = tree.subdirs(TRAIN_DIR)
    if not class_dirs:
        raise DataError(f"{tree.name(TRAIN_DIR)}: expected class folders 00000..00042.")
    for name in class_dirs:
        if not (len(name) == 5 and name.isdigit()):
            raise DataError(
                f"{tree.name(TRAIN_DIR + '/' + name)}: expected a class folder "
                f"named 00000..000{NUM_CLASSES - 1}."
            )
        folder = f"{TRAIN_DIR}/{name}"
        csv_rel = f"{folder}/GT-{name}.csv"
        if not tree.is_file(csv_rel):
            raise DataError(f"{tree.name(folder)}: GT-{name}.csv not found")
        yield from _examples(tree, folder, tree, csv_rel, cfg, problems, int(name))


class _SkipCounter:
    """Records the skipped count in the dataset's metadata after a split."""

    def __init__(self, info: tfds.core.DatasetInfo, problems: _Problems):
        self.info, self.problems = info, problems

    def wrap(self, split: str, examples: Iterator) -> Iterator:
        before = len(self.problems.messages)
        yield from examples
        skipped = len(self.problems.messages) - before
        messages = self.problems.messages
        self.info.metadata["skipped"] = len(messages)
        self.info.metadata["skipped_examples"] = messages[:_KEEP_MESSAGES]
        if skipped:
            logger.warning(
                "gtsrb %s: skipped %d corrupt example(s) (on_corrupt: skip).",
                split,
                skipped,
            )


# ----------------------------------------------------------------- builder


class Gtsrb(tfds.core.GeneratorBasedBuilder):
    """TFDS builder for GTSRB; see the module docstring.

    Args:
        on_corrupt: "error" raises a one-line `DataError` on the first bad
            CSV row or image; "skip" leaves them out, logs each at WARNING
            and records the count in `info.metadata["skipped"]`.
        **kwargs: `tfds.core.DatasetBuilder` arguments (data_dir, config).
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Official GTSRB final training and test sets."}
    BUILDER_CONFIGS = [
        _make_config(False, None),
        _make_config(True, None),
        _make_config(False, (32, 32)),
        _make_config(True, (32, 32)),
        _make_config(True, (48, 48)),
        _make_config(True, (64, 64)),
    ]
    DEFAULT_BUILDER_CONFIG_NAME = "full"
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""\
    Offline, put the three official archives from {URL}
    ({", ".join(ARCHIVES.values())}), or the folders they extract to
    (GTSRB/Final_Training/Images, GTSRB/Final_Test/Images, {TEST_GT}),
    in the manual directory.
    """

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # TFDS finds this file through importlib.resources, which fails for
        # editable installs of advtrain; the answer is simply this module.
        return epath.Path(__file__)

    def __init__(self, *, on_corrupt: str = "error", **kwargs):
        if on_corrupt not in ("error", "skip"):
            raise ValueError(
                "on_corrupt must be 'error' or 'skip'. "
                f"Received: on_corrupt={on_corrupt!r}"
            )
        self._on_corrupt = on_corrupt
        self._init_kwargs = {"on_corrupt": on_corrupt, **kwargs}
        super().__init__(**kwargs)

    # A builder is pickled to be rebuilt elsewhere (TFDS's own __getstate__
    # keeps data_dir, config and version only, and would drop on_corrupt).
    def __getstate__(self) -> dict:
        return {"init_kwargs": self._init_kwargs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state["init_kwargs"])

    def _info(self) -> tfds.core.DatasetInfo:
        size = self.builder_config.image_size
        shape = (*size, 3) if size else (None, None, 3)
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "German Traffic Sign Recognition Benchmark: 43 classes, "
                "39,209 training images in tracks of 30 frames and 12,630 "
                "test images, RGB, 15x15 to 250x250 px."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=shape),
                    "label": tfds.features.ClassLabel(names=CLASS_NAMES),
                    "track": tfds.features.Scalar(
                        dtype=np.int32,
                        doc="Physical sign in its class; -1 for test images.",
                    ),
                    "roi": tfds.features.Tensor(
                        shape=(4,),
                        dtype=np.int32,
                        doc="x1, y1, x2 (exclusive), y2 (exclusive) in the "
                        "original image.",
                    ),
                    "filename": tfds.features.Text(),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://benchmark.ini.rub.de/gtsrb_dataset.html",
            citation=_CITATION,
            metadata=tfds.core.MetadataDict(),
        )

    def _locate(self, dl_manager) -> _Layout:
        try:
            manual = dl_manager.manual_dir
        except AssertionError:  # TFDS: no manual dir, or an empty one.
            manual = None
        if manual is not None:
            return locate_manual_dir(Path(manual))
        base = archives_url()
        urls = {key: base + name for key, name in ARCHIVES.items()}
        try:
            # TFDS would retry an unreachable host for minutes.
            check_reachable(base)
            return _locate_downloaded(dl_manager.download(urls))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 (any network failure)
            raise DataError(
                f"gtsrb: could not download {base} ({one_line(exc)}). Offline,"
                f" put {', '.join(ARCHIVES.values())} or their extracted "
                "folders in a directory and name it in data.path "
                "(TFDS manual_dir)."
            ) from None

    def _split_generators(self, dl_manager):
        layout = self._locate(dl_manager)
        cfg = self.builder_config
        problems = _Problems(self._on_corrupt)
        counter = _SkipCounter(self.info, problems)
        test = _examples(
            layout.test, TEST_DIR, layout.gt, layout.gt_rel, cfg, problems, None
        )
        return {
            "train": counter.wrap("train", _train_examples(layout, cfg, problems)),
            "test": counter.wrap("test", test),
        }

    def _generate_examples(self, examples):  # pragma: no cover
        # Unused: _split_generators already returns generators.
        yield from examples


# ------------------------------------------------------------------ source


def split_by_track(
    labels: np.ndarray, tracks: np.ndarray, fraction: float, seed: int
) -> np.ndarray:
    """Returns a mask of examples held out for validation, whole tracks only.

    In each class, `round(fraction * tracks)` tracks (at least one when the
    class has two or more and `fraction > 0`, never all) go to validation.
    """
    labels, tracks = np.asarray(labels), np.asarray(tracks)
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), bool)
    if fraction <= 0:
        return held
    for cls in np.unique(labels):
        in_class = labels == cls
        ids = np.unique(tracks[in_class])
        n = int(round(fraction * len(ids)))
        n = min(max(n, 1 if len(ids) > 1 else 0), len(ids) - 1)
        chosen = rng.permutation(ids)[:n]
        held |= in_class & np.isin(tracks, chosen)
    return held


def prepare_gtsrb(
    *,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    roi_crop: bool = True,
    on_corrupt: str = "error",
) -> tfds.core.DatasetBuilder:
    """Prepares (once) and returns the GTSRB builder for these options.

    `path` is the TFDS manual directory (the official zips or their
    extracted folders); without it the archives are downloaded.
    """
    builder = tfds.builder(
        "gtsrb",
        data_dir=tfds_data_dir,
        config=gtsrb_config(roi_crop, image_size),
        on_corrupt=on_corrupt,
    )
    if builder.is_prepared():
        return builder
    manual = None
    if path is not None:
        manual = Path(path).expanduser()
        # Checked here: TFDS would take a missing manual dir as "download".
        locate_manual_dir(manual)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual)
    )
    return builder


def _skipped(builder, on_corrupt: str) -> int:
    skipped = int((builder.info.metadata or {}).get("skipped", 0))
    if skipped and on_corrupt == "error":
        raise DataError(
            f"{builder.data_dir}: prepared with on_corrupt: skip ({skipped} "
            "example(s) left out); on_corrupt: error expects every example. "
            "Delete that folder to prepare it again."
        )
    if skipped:
        logger.warning(
            "gtsrb: %d corrupt example(s) were left out when the data set was "
            "prepared (on_corrupt: skip).",
            skipped,
        )
    return skipped


def _labels_and_tracks(builder) -> tuple[np.ndarray, np.ndarray]:
    """The training labels and track ids, without decoding the images."""
    keys = builder.as_dataset(
        split="train",
        decoders=tfds.decode.PartialDecoding({"label": True, "track": True}),
    )
    labels, tracks = [], []
    for batch in keys.batch(8192).as_numpy_iterator():
        labels.append(batch["label"])
        tracks.append(batch["track"])
    labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    tracks = np.concatenate(tracks) if tracks else np.zeros(0, np.int32)
    return labels, tracks


def _train_by_track(builder, held_keys: np.ndarray, want_held: bool):
    """The training examples whose (label, track) key is (or is not) held."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(held_keys, tf.int64),
            tf.ones(len(held_keys), tf.int64),
        ),
        default_value=0,
    )

    def keep(ex):
        key = tf.cast(ex["label"], tf.int64) * 100_000 + tf.cast(ex["track"], tf.int64)
        return tf.equal(table.lookup(key), 1) == want_held

    ds = builder.as_dataset(split="train", shuffle_files=False)
    return ds.filter(keep).map(
        lambda ex: (ex["image"], tf.cast(ex["label"], tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


@register_source("gtsrb")
def gtsrb_splits(
    *,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    roi_crop: bool = True,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    on_corrupt: str = "error",
    seed: int = 0,
) -> DataSplits:
    """GTSRB train / test, with a validation split of whole tracks."""
    image_size = require(
        "gtsrb",
        "image_size",
        image_size,
        "one image size, e.g. image_size: [32, 32] (its images are 15..250 "
        "px and not square)",
    )
    builder = prepare_gtsrb(
        path=path,
        tfds_data_dir=tfds_data_dir,
        image_size=image_size,
        roi_crop=roi_crop,
        on_corrupt=on_corrupt,
    )
    skipped = _skipped(builder, on_corrupt)
    labels, tracks = _labels_and_tracks(builder)
    held = split_by_track(labels, tracks, val_fraction, seed)

    def supervised(split):
        # ClassLabel decodes to int64 already: no extra map per element.
        return builder.as_dataset(split=split, shuffle_files=False, as_supervised=True)

    n_val = int(held.sum())
    if n_val:
        # The key is unique per physical sign: track ids restart per class.
        held_keys = np.unique(labels[held] * 100_000 + tracks[held])
        train = _train_by_track(builder, held_keys, want_held=False)
        val = _train_by_track(builder, held_keys, want_held=True)
    else:
        train, val = supervised("train"), None
    train_size = len(labels) - n_val
    test_size = builder.info.splits["test"].num_examples
    if limit_train is not None and limit_train < train_size:
        train, train_size = train.take(limit_train), limit_train
    test = supervised("test")
    if limit_test is not None and limit_test < test_size:
        test, test_size = test.take(limit_test), limit_test
    return DataSplits(
        train=train,
        test=test,
        val=val,
        num_classes=NUM_CLASSES,
        image_shape=(*image_size, 3),
        train_size=train_size,
        test_size=test_size,
        val_size=n_val,
        class_names=list(CLASS_NAMES),
        skipped=skipped,
    )
