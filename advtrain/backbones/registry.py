"""The backbone registry and the facts each backbone carries."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Optional

from advtrain.utils.registry import Registry


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """What the classifier must know to feed a backbone correctly.

    Attributes:
        builder: `(input_shape, *, weights=None, **model_keys) ->
            keras.Model` mapping preprocessed images to a feature map or
            vector; `weights` is None or one of `pretrained` (a weights
            file is loaded by the classifier afterwards, not by the
            builder). It declares the model keys it uses, by name
            (e.g. `width`); `build` passes those and no others.
        preprocess: `BackbonePreprocess` mode applied inside the model to
            [0, 1] pixels: "none", "caffe", "tf", "torch" or "pixels255".
        channels: channels the backbone expects (3 for ImageNet models);
            None takes the dataset's.
        min_size: smallest input side the backbone accepts.
        default_size: the side its pretrained weights were trained at.
        pretrained: weight names the builder can fetch, e.g. ("imagenet",).
        weights_file: the file Keras caches under `$KERAS_HOME/models/`
            for the pretrained weights ("{size}" is filled in), named in
            the offline error when the download fails without a URL.
    """

    builder: Callable
    preprocess: str = "none"
    channels: Optional[int] = None
    min_size: int = 1
    default_size: Optional[int] = None
    pretrained: tuple[str, ...] = ()
    weights_file: Optional[str] = None

    def build(self, input_shape, *, weights: Optional[str] = None, **options: Any):
        """Calls the builder with `weights` and the `options` it declares."""
        parameters = inspect.signature(self.builder).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            names = {p.name for p in parameters}
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
