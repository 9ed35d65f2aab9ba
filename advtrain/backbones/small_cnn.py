"""A small BatchNorm CNN that trains in seconds on a CPU."""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone("small_cnn", preprocess="none")
def small_cnn(
    input_shape, *, weights: Optional[str] = None, width: int = 32
) -> keras.Model:
    """Three conv blocks (width, 2*width, 4*width), pooling only where the
    image is large enough (8x8 digits and 32x32 signs both work)."""
    del weights  # a weights file is loaded later
    inputs = keras.Input(shape=input_shape)
    x = inputs
    size = min(input_shape[0], input_shape[1])
    for i, filters in enumerate((width, 2 * width, 4 * width)):
        x = keras.layers.Conv2D(
            filters, 3, padding="same", use_bias=False, name=f"conv{i}"
        )(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
        if size >= 8 and i < 2:
            x = keras.layers.MaxPooling2D(2, name=f"pool{i}")(x)
            size //= 2
    return keras.Model(inputs, x, name="small_cnn")


@register_backbone("mnist_cnn", preprocess="none", min_size=4)
def mnist_cnn(
    input_shape, *, weights: Optional[str] = None, width: int = 32
) -> keras.Model:
    """The BatchNorm-free MNIST CNN of Wong, Rice and Kolter (2020): two
    4x4 stride-2 convs (width / 2, width filters), dense 100; at width 32
    the paper's model, so published MNIST numbers compare like for like."""
    del weights
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for i, filters in enumerate((max(1, width // 2), width)):
        x = keras.layers.Conv2D(
            filters, 4, strides=2, padding="same", activation="relu", name=f"conv{i}"
        )(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(100, activation="relu", name="fc")(x)
    return keras.Model(inputs, x, name="mnist_cnn")
