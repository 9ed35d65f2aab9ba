"""The TFDS builder `gtsrb` and its configs (`full`, `roi`, `roi_32x32`,
...), each prepared once into its own folder, and where its files come from:
the three official archives, downloaded or in a manual directory (zips or
the folders they extract to).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from advtrain.data.errors import DataArgumentError, DataError
from advtrain.data.gtsrb.rows import NUM_CLASSES, _examples, _Problems
from advtrain.utils.downloads import check_reachable
from advtrain.utils.errors import one_line

URL = "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/"
URL_ENV = "ADVTRAIN_GTSRB_URL"  # a mirror of the archives, same file names
ARCHIVES = {
    "train": "GTSRB_Final_Training_Images.zip",
    "test": "GTSRB_Final_Test_Images.zip",
    "test_gt": "GTSRB_Final_Test_GT.zip",
}
TRAIN_DIR = "GTSRB/Final_Training/Images"
TEST_DIR = "GTSRB/Final_Test/Images"
TEST_GT = "GT-final_test.csv"


def archives_url() -> str:
    """Where the archives download from: $ADVTRAIN_GTSRB_URL, else `URL`."""
    url = os.environ.get(URL_ENV) or URL
    return url if url.endswith("/") else url + "/"


class _Tree:
    # Files under a directory or in a zip archive, by '/'-separated paths.

    def __init__(self, root: Path, archive: bool = False):
        self.root, self.prefix = root, f"{root.name}:" if archive else ""
        if archive:
            try:
                self.zip = zipfile.ZipFile(root)
                self.root = zipfile.Path(self.zip)
            except (OSError, zipfile.BadZipFile) as exc:
                raise DataError(
                    f"{root.name}: not a readable zip archive ({one_line(exc)})."
                ) from None

    def name(self, rel: str) -> str:
        return self.prefix + rel

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def is_dir(self, rel: str) -> bool:
        return (self.root / rel).is_dir()

    def subdirs(self, rel: str) -> list[str]:
        return sorted(p.name for p in (self.root / rel).iterdir() if p.is_dir())

    def read(self, rel: str) -> bytes:
        try:
            return (self.root / rel).read_bytes()
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise OSError(f"corrupt archive member ({one_line(exc)})") from None


def _listing(root: Path, limit: int = 8) -> str:
    names = sorted(p.name for p in root.iterdir())
    shown = ", ".join(names[:limit]) or "nothing"
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _find_tree(root: Path, rel_dir: str, archive: str):
    if (root / rel_dir).is_dir():
        return _Tree(root)
    if (root / archive).is_file():
        tree = _Tree(root / archive, archive=True)
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
            return _Tree(root), rel
    if (root / ARCHIVES["test_gt"]).is_file():
        return _gt_in_zip(root / ARCHIVES["test_gt"])
    raise DataError(
        f"{root}: expected {TEST_GT} (test labels) or {ARCHIVES['test_gt']}. "
        f"Received: {_listing(root)}"
    )


def _gt_in_zip(path: Path):
    tree = _Tree(path, archive=True)
    for rel in sorted(tree.zip.namelist()):
        if rel.split("/")[-1] == TEST_GT:
            return tree, rel
    raise DataError(f"{path.name}: expected {TEST_GT} inside.")


def locate_manual_dir(root: Path) -> tuple:
    """Finds the train images, test images and test labels under `root`."""
    if not root.is_dir():
        raise DataError(
            f"{root}: GTSRB directory not found. Expected the official zips "
            "or their extracted GTSRB/ folder there."
        )
    if root.name == "GTSRB" and (root / "Final_Training" / "Images").is_dir():
        root = root.parent
    train = _find_tree(root, TRAIN_DIR, ARCHIVES["train"])
    test = _find_tree(root, TEST_DIR, ARCHIVES["test"])
    return (train, test, *_find_gt(root))


def _train_examples(tree, cfg, problems):
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


CLASS_NAMES = (
    "speed limit 20;speed limit 30;speed limit 50;speed limit 60;"
    "speed limit 70;speed limit 80;end of speed limit 80;speed limit 100;"
    "speed limit 120;no passing;no passing for vehicles over 3.5 t;"
    "right-of-way at next intersection;priority road;yield;stop;no vehicles;"
    "vehicles over 3.5 t prohibited;no entry;general caution;"
    "dangerous curve left;dangerous curve right;double curve;bumpy road;"
    "slippery road;road narrows on the right;road work;traffic signals;"
    "pedestrians;children crossing;bicycles crossing;beware of ice or snow;"
    "wild animals crossing;end of all speed and passing limits;"
    "turn right ahead;turn left ahead;ahead only;go straight or right;"
    "go straight or left;keep right;keep left;roundabout mandatory;"
    "end of no passing;end of no passing by vehicles over 3.5 t"
).split(";")


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


@dataclasses.dataclass(eq=False)
class GtsrbConfig(tfds.core.BuilderConfig):
    """How the images are stored: ROI crop and fixed size (height, width).
    Make one with `gtsrb_config(roi_crop, image_size)`, which names it."""

    roi_crop: bool = False
    image_size: Optional[tuple[int, int]] = None


def gtsrb_config(
    roi_crop: bool, image_size: Optional[tuple[int, int]] = None
) -> GtsrbConfig:
    """The builder config for these options (a predefined one if it exists)."""
    size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
    return _config(bool(roi_crop), size)


# Cached: TFDS accepts a config named like a predefined one only if it is it.
@functools.cache
def _config(roi_crop: bool, size: Optional[tuple[int, int]]) -> GtsrbConfig:
    name = ("roi" if roi_crop else "full") + (f"_{size[0]}x{size[1]}" if size else "")
    crop = "cropped to the sign's ROI" if roi_crop else "whole images"
    shape = f"resized to {size[0]}x{size[1]}" if size else "at native size"
    return GtsrbConfig(
        name=name,
        description=f"GTSRB {crop}, {shape}.",
        roi_crop=roi_crop,
        image_size=size,
    )


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
        gtsrb_config(False, None),
        gtsrb_config(True, None),
        gtsrb_config(False, (32, 32)),
        gtsrb_config(True, (32, 32)),
        gtsrb_config(True, (48, 48)),
        gtsrb_config(True, (64, 64)),
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

    def _locate(self, dl_manager) -> tuple:
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
            paths = {k: Path(v) for k, v in dl_manager.download(urls).items()}
            train, test = (_Tree(paths[k], archive=True) for k in ("train", "test"))
            return (train, test, *_gt_in_zip(paths["test_gt"]))
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 (any network failure)
            # The files were not given (`path`, TFDS's manual_dir): say so
            # under that argument's name.
            raise DataArgumentError(
                "path",
                f"no GTSRB files given, and gtsrb could not download {base} "
                f"({one_line(exc)}). Offline, put "
                f"{', '.join(ARCHIVES.values())} or their extracted folders "
                "in a directory and name it here (TFDS manual_dir).",
            ) from None

    def _split_generators(self, dl_manager):
        train, test, gt, gt_rel = self._locate(dl_manager)
        cfg = self.builder_config
        problems = _Problems(self._on_corrupt, self.info)
        test = _examples(test, TEST_DIR, gt, gt_rel, cfg, problems, None)
        return {
            "train": problems.count("train", _train_examples(train, cfg, problems)),
            "test": problems.count("test", test),
        }

    def _generate_examples(self, examples):  # pragma: no cover
        # Unused: _split_generators already returns generators.
        yield from examples
