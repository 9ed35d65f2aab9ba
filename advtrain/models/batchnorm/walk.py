"""Finding a model's layers: every sublayer, nested models and custom
layers' own sublayers included, and its BatchNormalization layers.

Below both the fused kernel (`fused.fuse_batchnorm` switches the layers it
finds) and the policy (`policy`), which use it.
"""

from __future__ import annotations

from collections.abc import Iterator

import keras


def walk_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Yields every layer below `layer` depth first, in model order.

    Descends into nested models and into custom layers that own sublayers,
    which `Model.layers` does not; each layer is yielded once.
    """
    seen: set[int] = set()

    def visit(node):
        # `_layers` is how Keras tracks sublayers of any layer; the public
        # `Model.layers` stops at the first level.
        for child in getattr(node, "_layers", []):
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            yield child
            yield from visit(child)

    yield from visit(layer)


def batchnorm_layers(
    model: keras.layers.Layer,
) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer in `model`, nested ones included."""
    return [
        layer
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
