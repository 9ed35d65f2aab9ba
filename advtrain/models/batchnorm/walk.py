"""Finding a model's layers: every sublayer, nested models and custom
layers' own sublayers included, and its BatchNormalization layers."""

from __future__ import annotations

from collections.abc import Iterator

import keras


def sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """`layer`'s direct sublayers, a custom layer's own included (Keras
    tracks them in `_layers`; the public `Model.layers` is for models)."""
    return list(getattr(layer, "_layers", []))


def walk_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Yields every layer below `layer` once, depth first, in model order."""
    seen: set[int] = set()

    def visit(node):
        for child in sublayers(node):
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
