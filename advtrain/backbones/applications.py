"""The keras.applications backbones, without their tops.

Each entry says how the classifier must feed it (`preprocess`, applied
inside the model to [0, 1] pixels) and which ImageNet file Keras caches:

- resnet50: caffe preprocessing (BGR, 0..255, ImageNet mean subtracted);
- inception_v3 and mobilenet_v2: "tf" preprocessing ([-1, 1]);
  MobileNetV2 (alpha 1.0) is small enough to fine-tune on a CPU;
- efficientnet_b0: its rescaling and ImageNet normalisation are layers of
  the Keras model, fed 0..255 RGB, so the classifier only scales [0, 1]
  pixels by 255.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


def _without_top(application: Callable) -> Callable:
    """A backbone builder for a keras.applications constructor."""

    def builder(input_shape, *, weights: Optional[str] = None) -> keras.Model:
        model = application(
            include_top=False, weights=weights, input_shape=tuple(input_shape)
        )
        # MobileNetV2 builds its BatchNorm at momentum 0.999, slower still
        # than Keras's 0.99. The BatchNorm policy ("auto") gives the layers
        # at Keras's default the run's momentum and keeps a value someone
        # chose: a backbone's own constructor choice goes to the default.
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
    # Keras has MobileNetV2 ImageNet weights for sides 96, 128, 160, 192 and
    # 224 and falls back to the 224 file for any other side.
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
