"""Backbone registry: each entry knows its builder and its preprocessing.

Registered: small_cnn, mnist_cnn, resnet50, inception_v3, mobilenet_v2, efficientnet_b0.
"""

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
