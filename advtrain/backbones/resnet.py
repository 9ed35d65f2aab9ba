"""ResNet50 from keras.applications (caffe preprocessing, BGR, 0..255)."""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone(
    "resnet50",
    preprocess="caffe",
    channels=3,
    min_size=32,
    default_size=224,
    pretrained=("imagenet",),
    weights_file="resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
)
def resnet50(input_shape, cfg, weights: Optional[str] = None) -> keras.Model:
    """ResNet50 without its top; returns the last feature map."""
    del cfg
    return keras.applications.ResNet50(
        include_top=False, weights=weights, input_shape=tuple(input_shape)
    )
