"""The backbone registry and the facts each backbone carries."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

from advtrain.utils.keywords import keyword_names
from advtrain.utils.registry import Registry


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """What the classifier must know to feed a backbone correctly.

    Attributes:
        builder: `(input_shape, *, weights=None, **model_keys) ->
            keras.Model`, preprocessed images to features; `weights` is None
            or one of `pretrained`. `build` passes it the model keys it
            declares by name (e.g. `width`).
        preprocess: the `BackbonePreprocess` mode applied to [0, 1] pixels.
        channels: channels the backbone expects; None takes the dataset's.
        min_size: smallest input side the backbone accepts.
        default_size: the side its pretrained weights were trained at.
        pretrained: weight names the builder can fetch, e.g. ("imagenet",).
        weights_file: the file Keras caches for them under
            `$KERAS_HOME/models/` ("{size}" filled in).
    """

    builder: Callable
    preprocess: str = "none"
    channels: Optional[int] = None
    min_size: int = 1
    default_size: Optional[int] = None
    pretrained: tuple[str, ...] = ()
    weights_file: Optional[str] = None

    def build(self, input_shape, *, weights: Optional[str] = None, **options: Any):
        names = keyword_names(self.builder)
        if names is not None:  # a builder taking **kwargs gets every option
            options = {k: v for k, v in options.items() if k in names}
        return self.builder(tuple(input_shape), weights=weights, **options)


backbones: Registry[BackboneSpec] = Registry("backbone")


def register_backbone(name: str, **facts) -> Callable:
    """Decorator registering `builder` under `name` with its facts.

    Example:

    ```python
    @register_backbone("tiny", preprocess="none", min_size=8)
    def tiny(input_shape, *, weights=None, width=32):
        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Conv2D(width, 3)(inputs))
    ```
    """

    def decorator(builder: Callable) -> Callable:
        backbones.register(name)(BackboneSpec(builder=builder, **facts))
        return builder

    return decorator
