"""MobileNetV2 from keras.applications: small enough to fine-tune on a CPU."""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone(
    "mobilenet_v2",
    preprocess="tf",
    channels=3,
    min_size=32,
    default_size=224,
    pretrained=("imagenet",),
    # Keras has ImageNet weights for sides 96, 128, 160, 192 and 224 and
    # falls back to the 224 file for any other side.
    weights_file="mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{size}_no_top.h5",
)
def mobilenet_v2(input_shape, cfg, weights: Optional[str] = None) -> keras.Model:
    """MobileNetV2 (alpha 1.0) without its top."""
    del cfg
    return keras.applications.MobileNetV2(
        include_top=False, weights=weights, input_shape=tuple(input_shape)
    )
