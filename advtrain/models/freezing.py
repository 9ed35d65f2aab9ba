"""Freezing policy and the two-phase fine-tuning schedule.

Freezing uses `trainable`, not `backbone(x, training=False)`: in Keras 3
the outer call's `training` reaches nested layers (keras-team/keras#20285),
while a BN layer with `trainable=False` always runs in inference mode.

- `frozen`: the backbone is non-trainable; only the head trains.
- `top_k`: the top `k` backbone layers with weights (BN included) train
  with the head; their BN layers only with `bn_trainable`.
- `all_trainable`: everything trains; BN layers unless `bn_trainable` is
  False.

`phases` splits training into a head-only warmup and a fine-tune phase at
`lr * finetune_lr_factor`. Per phase: `apply_phase`, then `compile` (a
compiled step keeps its trainable set) with a fresh optimizer, then
`fit(initial_epoch=phase.start_epoch, epochs=phase.end_epoch)`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import keras

from advtrain.models.batchnorm.walk import sublayers, walk_layers

FreezeMode = Literal["all_trainable", "frozen", "top_k"]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of training with a fixed trainable set.

    Attributes:
        name: "warmup" (head only), "finetune" (after a warmup) or "train"
            (the only phase).
        start_epoch: first epoch, for `fit(initial_epoch=...)`.
        end_epoch: epoch to stop at, for `fit(epochs=...)`.
        freeze: the freeze mode during this phase.
        top_k: backbone layers with weights trained under `top_k`.
        bn_trainable: whether backbone BN layers train.
        lr_factor: multiply the base learning rate by this.
    """

    name: str
    start_epoch: int
    end_epoch: int
    freeze: FreezeMode
    top_k: int = 0
    bn_trainable: bool = True
    lr_factor: float = 1.0

    @property
    def epochs(self) -> int:
        return self.end_epoch - self.start_epoch


def resolve_bn_trainable(freeze: str, bn_trainable: Optional[bool]) -> bool:
    """`bn_trainable` with None resolved for `freeze`."""
    if freeze == "frozen":
        return False
    if bn_trainable is None:
        return freeze == "all_trainable"
    return bn_trainable


def phases(
    epochs: int,
    *,
    head_only_epochs: int = 0,
    freeze: FreezeMode = "all_trainable",
    top_k: int = 0,
    finetune_lr_factor: float = 0.1,
    bn_trainable: Optional[bool] = None,
) -> list[Phase]:
    """The training schedule over `epochs`.

    With `head_only_epochs == 0` or `freeze == "frozen"`: one phase,
    "train". Otherwise "warmup" (`min(head_only_epochs, epochs)` head-only
    epochs), then "finetune" for the rest under `freeze` at
    `lr * finetune_lr_factor` (omitted when no epoch remains).

    Example:

    ```python
    phases(5, freeze="top_k", top_k=10, head_only_epochs=2)
    # warmup 0->2 (frozen, lr x1), finetune 2->5 (lr x0.1)
    ```
    """
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0. Received: epochs={epochs}")
    bn = resolve_bn_trainable(freeze, bn_trainable)
    if head_only_epochs == 0 or freeze == "frozen":
        return [Phase("train", 0, epochs, freeze, top_k, bn, 1.0)]
    warm = min(head_only_epochs, epochs)
    schedule = [Phase("warmup", 0, warm, "frozen", 0, False, 1.0)]
    if epochs > warm:
        schedule.append(
            Phase("finetune", warm, epochs, freeze, top_k, bn, finetune_lr_factor)
        )
    return schedule


def get_backbone(model: keras.Model) -> keras.Model:
    """The backbone (the one nested model) of a `build_classifier` model,
    or of a model wrapping it in `classifier` (AdversarialModel)."""
    model = _classifier(model)
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if len(nested) != 1:
        raise ValueError(
            "Expected a classifier with exactly one nested backbone model. "
            f"Received: {model.name} with {len(nested)} nested models"
        )
    return nested[0]


def _classifier(model: keras.Model) -> keras.Model:
    inner = getattr(model, "classifier", None)
    return inner if isinstance(inner, keras.Model) else model


def _weighted_layers(backbone: keras.Model) -> list[keras.layers.Layer]:
    # Leaf layers with weights an optimizer could train (BN included, fixed
    # preprocessing not), input to output, while the backbone is trainable.
    return [
        layer
        for layer in walk_layers(backbone)
        if not sublayers(layer)
        and (
            layer.trainable_weights
            or isinstance(layer, keras.layers.BatchNormalization)
        )
    ]


def apply_freeze(
    model: keras.Model,
    freeze: FreezeMode,
    top_k: int = 0,
    bn_trainable: Optional[bool] = None,
) -> list[str]:
    """Sets the backbone's trainable flags (the head stays trainable);
    returns the names of the backbone layers left trainable. `top_k`: how
    many weighted layers train under "top_k"; `bn_trainable`: whether BN
    layers among them train (None: `resolve_bn_trainable`). Recompile
    afterwards."""
    if freeze not in ("all_trainable", "frozen", "top_k"):
        raise ValueError(
            f"freeze must be all_trainable, frozen or top_k. Received: freeze={freeze}"
        )
    if freeze == "top_k" and top_k < 1:
        raise ValueError(f"freeze=top_k needs top_k >= 1. Received: {top_k}")
    bn_trainable = resolve_bn_trainable(freeze, bn_trainable)
    classifier = _classifier(model)
    backbone = get_backbone(classifier)
    classifier.trainable = True
    if freeze == "frozen":
        backbone.trainable = False
        return []
    # True on every container first: a parent that is not trainable hides
    # its trainable children from the optimizer.
    backbone.trainable = True
    layers = _weighted_layers(backbone)
    chosen = layers if freeze == "all_trainable" else layers[-top_k:]
    chosen_ids = {id(layer) for layer in chosen}
    for layer in layers:
        trains = id(layer) in chosen_ids
        if isinstance(layer, keras.layers.BatchNormalization):
            trains = trains and bn_trainable
        layer.trainable = trains
    return [layer.name for layer in layers if layer.trainable]


def apply_phase(model: keras.Model, phase: Phase) -> list[str]:
    """Applies a `Phase`'s freezing; returns the trainable backbone layers.
    Recompile afterwards, at learning rate `lr * phase.lr_factor`."""
    return apply_freeze(model, phase.freeze, phase.top_k, phase.bn_trainable)
