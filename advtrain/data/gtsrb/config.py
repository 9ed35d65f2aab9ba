"""The builder's configs: how GTSRB's images are stored (ROI crop, fixed
size), each config prepared once into its own folder.

Below both `builder` (the TFDS builder lists them) and `rows` (which
encodes each image by its config).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow_datasets as tfds


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
