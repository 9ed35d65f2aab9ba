"""A small BatchNorm CNN that trains in seconds on a CPU."""

from __future__ import annotations

from typing import Optional

import keras

from advtrain.backbones.registry import register_backbone


@register_backbone("small_cnn", preprocess="none")
def small_cnn(input_shape, cfg, weights: Optional[str] = None) -> keras.Model:
    """Three conv blocks (width, 2*width, 4*width); pooling only where the
    image is large enough, so 8x8 digits and 32x32 signs both work."""
    del weights  # No pretrained weights; a weights file is loaded later.
    width = cfg.width
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
