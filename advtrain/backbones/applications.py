"""The keras.applications backbones, without their tops, each with its
preprocessing (EfficientNet normalises inside, fed 0..255 RGB) and the
ImageNet file Keras caches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


def _without_top(application: Callable) -> Callable:
    def builder(input_shape, *, weights: Optional[str] = None) -> keras.Model:
        model = application(
            include_top=False, weights=weights, input_shape=tuple(input_shape)
        )
        # MobileNetV2 builds its BatchNorm at momentum 0.999: down to Keras's
        # default, which the BatchNorm policy ("auto") adapts to the run.
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = min(layer.momentum, 0.99)
        return model

    builder.__doc__ = f"{application.__name__} without its top."
    builder.__name__ = builder.__qualname__ = application.__name__
    return builder


# name: (constructor, preprocess, min_size, default_size, weights file)
_APPLICATIONS = {
    "resnet50": (
        keras.applications.ResNet50,
        "caffe",
        32,
        224,
        "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
    ),
    "inception_v3": (
        keras.applications.InceptionV3,
        "tf",
        75,
        299,
        "inception_v3_weights_tf_dim_ordering_tf_kernels_notop.h5",
    ),
    "mobilenet_v2": (
        keras.applications.MobileNetV2,
        "tf",
        32,
        224,
        "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{size}_no_top.h5",
    ),
    "efficientnet_b0": (
        keras.applications.EfficientNetB0,
        "pixels255",
        32,
        224,
        "efficientnetb0_notop.h5",
    ),
}

for _name, (_application, _mode, _min, _default, _file) in _APPLICATIONS.items():
    register_backbone(
        _name,
        preprocess=_mode,
        channels=3,
        min_size=_min,
        default_size=_default,
        pretrained=("imagenet",),
        weights_file=_file,
    )(_without_top(_application))
