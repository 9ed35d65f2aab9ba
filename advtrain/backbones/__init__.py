"""Backbone registry: each entry knows its builder and its preprocessing."""

from advtrain.backbones.registry import BackboneSpec, backbones, register_backbone
from advtrain.backbones import small_cnn  # noqa: F401  (registers small_cnn)

__all__ = ["BackboneSpec", "backbones", "register_backbone"]
