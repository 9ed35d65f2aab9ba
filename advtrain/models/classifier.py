"""Classifier = input adapter -> preprocess -> backbone -> pooling -> logits."""

from __future__ import annotations

import keras

from advtrain.backbones import backbones
from advtrain.config import ModelConfig
from advtrain.models.layers import BackbonePreprocess, ToChannels


def build_classifier(
    cfg: ModelConfig,
    image_shape: tuple[int, int, int],
    num_classes: int,
) -> keras.Model:
    """Builds a classifier taking raw pixels and returning float32 logits.

    Args:
        cfg: the recipe's model section.
        image_shape: the dataset's native (height, width, channels).
        num_classes: number of logits.

    Example:

    ```python
    from advtrain.config import ModelConfig
    model = build_classifier(ModelConfig(width=8), (8, 8, 1), 10)
    model(np.zeros((2, 8, 8, 1), "float32")).shape  # (2, 10)
    ```
    """
    spec = backbones.get(cfg.backbone)
    height, width, channels = image_shape
    # Always float pixels in [0, 1]: the space attacks, eps and clipping
    # live in. Pipelines convert uint8 before batching (make_input).
    inputs = keras.Input(shape=image_shape, name="pixels", dtype="float32")
    x = inputs
    target_channels = spec.channels or channels
    if target_channels != channels:
        x = ToChannels(target_channels, name="to_channels")(x)
    size = cfg.input_size
    if size is None and (min(height, width) < spec.min_size):
        side = spec.default_size or spec.min_size
        size = (side, side)
    if size is not None and tuple(size) != (height, width):
        x = keras.layers.Resizing(size[0], size[1], name="resize")(x)
    x = BackbonePreprocess(spec.preprocess, name="preprocess")(x)
    backbone = spec.builder(tuple(x.shape[1:]), cfg)
    features = backbone(x)
    if len(features.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="pool")(features)
    if cfg.dropout:
        features = keras.layers.Dropout(cfg.dropout, name="dropout")(features)
    logits = keras.layers.Dense(num_classes, name="logits", dtype="float32")(
        features
    )
    return keras.Model(inputs, logits, name=f"{cfg.backbone}_classifier")
