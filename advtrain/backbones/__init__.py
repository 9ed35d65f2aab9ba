"""Backbone registry: each entry knows its builder and its preprocessing."""

from advtrain.backbones import (  # noqa: F401  (each module registers itself)
    applications,
    small_cnn,
)
from advtrain.backbones.registry import (
    BackboneSpec,
    backbones,
    register_backbone,
)

__all__ = ["BackboneSpec", "backbones", "register_backbone"]
