"""EfficientNetB0 from keras.applications.

Its rescaling and ImageNet normalisation are layers of the Keras model, fed
0..255 RGB, so the classifier only scales [0, 1] pixels by 255.
"""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone(
    "efficientnet_b0",
    preprocess="pixels255",
    channels=3,
    min_size=32,
    default_size=224,
    pretrained=("imagenet",),
    weights_file="efficientnetb0_notop.h5",
)
def efficientnet_b0(input_shape, cfg, weights: Optional[str] = None) -> keras.Model:
    """EfficientNetB0 without its top."""
    del cfg
    return keras.applications.EfficientNetB0(
        include_top=False, weights=weights, input_shape=tuple(input_shape)
    )
