"""Serializable layers that let the model take raw [0, 1] pixels."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="advtrain")
class BackbonePreprocess(keras.layers.Layer):
    """Maps [0, 1] pixels to a backbone's input space, inside the model.

    Modes follow `keras.applications.imagenet_utils.preprocess_input`
    ("caffe", "tf", "torch"), plus "none" and "pixels255" (0..255, for
    models that normalise inside, such as EfficientNet).

    Example: `BackbonePreprocess("caffe")(np.ones((1, 2, 2, 3)))`: 255 minus
    the BGR ImageNet mean.
    """

    MODES = ("none", "caffe", "tf", "torch", "pixels255")
    _MEAN = (0.485, 0.456, 0.406)
    _STD = (0.229, 0.224, 0.225)
    _CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)

    def __init__(self, mode: str = "none", **kwargs):
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(
                f"mode must be one of {', '.join(self.MODES)}. Received: mode={mode}"
            )
        self.mode = mode

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        if self.mode == "tf":
            return x * 2.0 - 1.0
        if self.mode == "torch":
            mean = ops.convert_to_tensor(self._MEAN, dtype=x.dtype)
            std = ops.convert_to_tensor(self._STD, dtype=x.dtype)
            return (x - mean) / std
        if self.mode == "caffe":
            x = ops.flip(x, axis=-1) * 255.0
            mean = ops.convert_to_tensor(self._CAFFE_MEAN_BGR, dtype=x.dtype)
            return x - mean
        if self.mode == "pixels255":
            return x * 255.0
        return x

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


@keras.saving.register_keras_serializable(package="advtrain")
class ToChannels(keras.layers.Layer):
    """Repeats a single grayscale channel to the backbone's channel count."""

    def __init__(self, channels: int, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels

    def call(self, inputs):
        if inputs.shape[-1] == self.channels:
            return inputs
        if inputs.shape[-1] != 1:
            raise ValueError(
                f"Cannot map {inputs.shape[-1]} channels to {self.channels}; "
                "only grayscale (1 channel) is expanded."
            )
        return ops.repeat(inputs, self.channels, axis=-1)

    def get_config(self):
        return {**super().get_config(), "channels": self.channels}


@keras.saving.register_keras_serializable(package="advtrain")
class ResizeTo(keras.layers.Layer):
    """Resizes images to (height, width), bilinear, inside the model.

    Not `keras.layers.Resizing`: its `call` defaults to `training=True`,
    which would put every later BatchNormalization in training mode when
    the model is called as `model(x)`.

    Example: `ResizeTo(75, 75)(np.zeros((2, 28, 28, 3))).shape  # (2, 75, 75, 3)`
    """

    def __init__(self, height: int, width: int, **kwargs):
        super().__init__(**kwargs)
        if height < 1 or width < 1:
            raise ValueError(
                "height and width must be >= 1. "
                f"Received: height={height}, width={width}"
            )
        self.height = int(height)
        self.width = int(width)

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        return ops.image.resize(x, (self.height, self.width), interpolation="bilinear")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.height, self.width, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "height": self.height, "width": self.width}
