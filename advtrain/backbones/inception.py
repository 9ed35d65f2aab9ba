"""InceptionV3 from keras.applications ("tf" preprocessing, [-1, 1])."""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone(
    "inception_v3",
    preprocess="tf",
    channels=3,
    min_size=75,
    default_size=299,
    pretrained=("imagenet",),
    weights_file="inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5",
)
def inception_v3(input_shape, cfg, weights: Optional[str] = None) -> keras.Model:
    """InceptionV3 without its top; returns the last feature map."""
    del cfg
    return keras.applications.InceptionV3(
        include_top=False, weights=weights, input_shape=tuple(input_shape)
    )
