"""The TFDS builder `gtsrb` and its configs (`full`, `roi`, `roi_32x32`,
...): how the images are stored, each prepared once into its own folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from advtrain.data.errors import DataArgumentError, DataError
from advtrain.data.gtsrb.archive import (
    ARCHIVES,
    TEST_DIR,
    TEST_GT,
    URL,
    _Layout,
    _locate_downloaded,
    archives_url,
    locate_manual_dir,
)
from advtrain.data.gtsrb.rows import _examples, _Problems, _train_examples
from advtrain.utils.downloads import check_reachable
from advtrain.utils.errors import one_line

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
        layout = self._locate(dl_manager)
        cfg = self.builder_config
        problems = _Problems(self._on_corrupt, self.info)
        test = _examples(
            layout.test, TEST_DIR, layout.gt, layout.gt_rel, cfg, problems, None
        )
        return {
            "train": problems.count("train", _train_examples(layout, cfg, problems)),
            "test": problems.count("test", test),
        }

    def _generate_examples(self, examples):  # pragma: no cover
        # Unused: _split_generators already returns generators.
        yield from examples
