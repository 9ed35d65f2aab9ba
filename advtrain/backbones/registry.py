"""The backbone registry and the facts each backbone carries."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from advtrain.registry import Registry


@dataclasses.dataclass(frozen=True)
class BackboneSpec:
    """What the classifier must know to feed a backbone correctly.

    Attributes:
        builder: `(input_shape, cfg) -> keras.Model` mapping preprocessed
            images to a feature map or vector.
        preprocess: Keras `preprocess_input` mode applied inside the model:
            "none" (pixels in [0, 1]), "caffe", "tf" or "torch".
        channels: channels the backbone expects (3 for ImageNet models).
        min_size: smallest input side the backbone accepts.
        default_size: input side used when the recipe sets none.
    """

    builder: Callable
    preprocess: str = "none"
    channels: Optional[int] = None
    min_size: int = 1
    default_size: Optional[int] = None


backbones: Registry[BackboneSpec] = Registry("backbone")


def register_backbone(name: str, **facts) -> Callable:
    """Decorator registering `builder` under `name` with its facts."""

    def decorator(builder: Callable) -> Callable:
        backbones.register(name)(BackboneSpec(builder=builder, **facts))
        return builder

    return decorator
