"""Classifier = input adapter -> preprocess -> backbone -> pooling -> logits.

The model takes raw [0, 1] pixels at the dataset's native shape; channel
mapping, resizing and the backbone's preprocessing are layers of it, so
eps is in pixel units whatever the backbone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import keras

from advtrain.backbones import BackboneSpec, backbones
from advtrain.models.layers import BackbonePreprocess, ResizeTo, ToChannels
from advtrain.models.weights import (
    build_backbone,
    is_pretrained_name,
    load_weights_file,
)
from advtrain.utils.errors import ArgumentError


def backbone_spec(name: str) -> BackboneSpec:
    """The registry entry for `name` (an `ArgumentError` naming `backbone`)."""
    if name not in backbones:
        raise ArgumentError("backbone", backbones.unknown_message(name))
    return backbones.get(name)


def backbone_input_size(
    backbone: str,
    height: int,
    width: int,
    *,
    input_size: Optional[Sequence[int]] = None,
    weights: Optional[str] = None,
) -> tuple[int, int]:
    """The (height, width) the backbone named `backbone` sees: `input_size`
    when set (at least the backbone's minimum), else the native size,
    scaled up (aspect kept) when its short side is below the minimum: to
    the default size with pretrained weights, else to the minimum."""
    spec = backbone_spec(backbone)
    if input_size is not None:
        size = (int(input_size[0]), int(input_size[1]))
        if min(size) < spec.min_size:
            raise ArgumentError(
                "input_size",
                f"{backbone} needs sides >= {spec.min_size}. "
                f"Received: input_size={list(size)}",
            )
        return size
    short = min(height, width)
    if short >= spec.min_size:
        return (height, width)
    target = spec.min_size
    if weights is not None and spec.default_size:
        target = max(target, spec.default_size)
    scale = target / short
    return (
        max(target, math.ceil(height * scale)),
        max(target, math.ceil(width * scale)),
    )


def build_classifier(
    image_shape: Sequence[int],
    num_classes: int,
    *,
    backbone: str = "small_cnn",
    weights: Optional[str] = None,
    input_size: Optional[Sequence[int]] = None,
    width: int = 32,
    dropout: float = 0.0,
) -> keras.Model:
    """Builds a classifier taking raw pixels and returning float32 logits.

    Layers: `pixels` -> `to_channels` and `resize` (when needed) ->
    `preprocess` -> backbone (the one nested model) -> `pool` -> `dropout`
    (when set) -> `logits`.

    Args:
        image_shape: the dataset's native (height, width, channels).
        num_classes: number of logits.
        backbone: a registered backbone name (`advtrain.backbones`).
        weights: None (random), "imagenet", or a weights file
            (`advtrain.models.weights`).
        input_size: (height, width) the backbone sees; None: derived.
        width: base width of the builders that take one.
        dropout: dropout rate before the logits (0: no dropout layer).

    Example:

    ```python
    model = build_classifier((8, 8, 1), 10, backbone="small_cnn", width=8)
    model(np.zeros((2, 8, 8, 1), "float32")).shape  # (2, 10)
    ```
    """
    if len(image_shape) != 3 or min(image_shape) < 1:
        raise ValueError(
            "image_shape must be (height, width, channels). "
            f"Received: image_shape={image_shape}"
        )
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1. Received: {num_classes}")
    spec = backbone_spec(backbone)
    height, side, channels = (int(v) for v in image_shape)

    # Input adapter: raw [0, 1] pixels to the backbone's channels and size.
    inputs = keras.Input(shape=(height, side, channels), name="pixels", dtype="float32")
    size = backbone_input_size(
        backbone, height, side, input_size=input_size, weights=weights
    )
    x, target_channels = inputs, spec.channels or channels
    if target_channels != channels:
        x = ToChannels(target_channels, name="to_channels")(x)
    if size != (height, side):
        x = ResizeTo(size[0], size[1], name="resize")(x)
    x = BackbonePreprocess(spec.preprocess, name="preprocess")(x)

    # Backbone and head.
    trunk = build_backbone(
        backbone, spec, (*size, target_channels), weights=weights, width=width
    )
    features = trunk(x)
    if len(features.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="pool")(features)
    if dropout:
        features = keras.layers.Dropout(dropout, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(features)
    model = keras.Model(inputs, logits, name=f"{backbone}_classifier")

    if weights is not None and not is_pretrained_name(weights):
        load_weights_file(model, trunk, weights)
    return model


def classifier_head(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers after the backbone (pool, dropout, logits), in order."""
    return [
        layer for layer in model.layers if layer.name in ("pool", "dropout", "logits")
    ]


def describe(model: keras.Model) -> Optional[str]:
    """One line: the input adapter and the backbone."""
    parts = []
    for layer in model.layers:
        if layer.name == "to_channels":
            parts.append(f"gray->{layer.channels}ch")
        elif layer.name == "resize":
            parts.append(f"resize {layer.height}x{layer.width}")
        elif layer.name == "preprocess":
            parts.append(f"preprocess {layer.mode}")
        elif isinstance(layer, keras.Model):
            parts.append(f"backbone {layer.name}")
    return " -> ".join(parts) or None
