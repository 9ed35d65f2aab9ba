"""Classifier = input adapter -> preprocess -> backbone -> pooling -> logits.

The model takes raw pixels in [0, 1] at the dataset's native size and
channel count. Grayscale-to-RGB, resizing to the backbone's input size and
the backbone's own preprocessing are layers of the model, so eps, step
sizes and clipping are in pixel units whatever the backbone, and a saved
`.keras` file serves raw images.
"""

from __future__ import annotations

import math
from typing import Optional

import keras

from advtrain.backbones import BackboneSpec, backbones
from advtrain.config import ModelConfig, RecipeError
from advtrain.models.layers import BackbonePreprocess, ResizeTo, ToChannels
from advtrain.models.weights import (
    build_backbone,
    is_pretrained_name,
    load_weights_file,
)


def backbone_spec(name: str) -> BackboneSpec:
    """The registry entry for `name`; RecipeError listing the known ones."""
    if name not in backbones:
        raise RecipeError(f"model.backbone: {backbones.unknown_message(name)}")
    return backbones.get(name)


def backbone_input_size(
    cfg: ModelConfig, spec: BackboneSpec, height: int, width: int
) -> tuple[int, int]:
    """The (height, width) the backbone sees.

    `cfg.input_size` when set (it must reach the backbone's minimum);
    otherwise the native size, scaled up with its aspect ratio kept when
    its short side is below the minimum: to the backbone's default size
    when pretrained weights are loaded (the scale they were trained at),
    else to the minimum (cheapest).
    """
    if cfg.input_size is not None:
        size = (int(cfg.input_size[0]), int(cfg.input_size[1]))
        if min(size) < spec.min_size:
            raise RecipeError(
                f"model.input_size: {cfg.backbone} needs sides >= "
                f"{spec.min_size}. Received: input_size={list(size)}"
            )
        return size
    short = min(height, width)
    if short >= spec.min_size:
        return (height, width)
    target = spec.min_size
    if cfg.weights is not None and spec.default_size:
        target = max(target, spec.default_size)
    scale = target / short
    return (
        max(target, math.ceil(height * scale)),
        max(target, math.ceil(width * scale)),
    )


def build_classifier(
    cfg: ModelConfig,
    image_shape: tuple[int, int, int],
    num_classes: int,
) -> keras.Model:
    """Builds a classifier taking raw pixels and returning float32 logits.

    Layers: `pixels` (float32 in [0, 1], the dataset's native shape) ->
    `to_channels` (grayscale to RGB, when needed) -> `resize` (when the
    backbone needs another size, see `backbone_input_size`) -> `preprocess`
    (the backbone's mode) -> backbone (the one nested model) -> `pool` ->
    `dropout` (when `cfg.dropout`) -> `logits`.

    Weights follow `cfg.weights` (see `advtrain.models.weights`). Freezing
    and the BatchNorm policy are applied afterwards by
    `advtrain.models.freezing.apply_phase` and
    `advtrain.models.batchnorm.apply_batchnorm_policy`.

    Args:
        cfg: the recipe's model section.
        image_shape: the dataset's native (height, width, channels).
        num_classes: number of logits.

    Raises:
        RecipeError: unknown backbone, input size below the backbone's
            minimum, or weights that cannot be fetched or loaded.

    Example:

    ```python
    from advtrain.config import ModelConfig
    model = build_classifier(ModelConfig(width=8), (8, 8, 1), 10)
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
    spec = backbone_spec(cfg.backbone)
    height, width, channels = (int(v) for v in image_shape)

    # Input adapter: raw [0, 1] pixels to the backbone's channels and size.
    inputs = keras.Input(
        shape=(height, width, channels), name="pixels", dtype="float32"
    )
    x = inputs
    target_channels = spec.channels or channels
    if target_channels != channels:
        x = ToChannels(target_channels, name="to_channels")(x)
    size = backbone_input_size(cfg, spec, height, width)
    if size != (height, width):
        x = ResizeTo(size[0], size[1], name="resize")(x)
    x = BackbonePreprocess(spec.preprocess, name="preprocess")(x)

    # Backbone and head.
    backbone = build_backbone(
        cfg.backbone, spec, (size[0], size[1], target_channels), cfg
    )
    features = backbone(x)
    if len(features.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="pool")(features)
    if cfg.dropout:
        features = keras.layers.Dropout(cfg.dropout, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(features)
    model = keras.Model(inputs, logits, name=f"{cfg.backbone}_classifier")

    if cfg.weights is not None and not is_pretrained_name(cfg.weights):
        load_weights_file(model, backbone, cfg.weights)
    return model


def classifier_head(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers after the backbone (pool, dropout, logits), in order."""
    names = ("pool", "dropout", "logits")
    return [layer for layer in model.layers if layer.name in names]


def describe(model: keras.Model) -> Optional[str]:
    """One line: input adapter and backbone, for the run's start banner."""
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
