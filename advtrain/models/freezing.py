"""Freezing policy and the two-phase fine-tuning schedule.

Freezing uses `trainable`, not `backbone(x, training=False)`: in Keras 3
the outer call's `training` reaches nested layers (keras-team/keras#20285),
while a BN layer with `trainable=False` always runs in inference mode.
Per phase: `apply_phase`, then `compile` with a fresh optimizer (a compiled
step keeps its trainable set), then `fit(initial_epoch=phase.start_epoch,
epochs=phase.end_epoch)`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import keras

from advtrain.models.batchnorm.walk import sublayers, walk_layers

FreezeMode = Literal["all_trainable", "frozen", "top_k"]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of training with a fixed trainable set: "warmup" (head
    only), "finetune" (after a warmup) or "train" (the only phase), from
    `start_epoch` to `end_epoch`, at `lr_factor` times the base learning
    rate; the rest as `apply_freeze` takes it."""

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


def _bn_trainable(freeze: str, bn_trainable: Optional[bool]) -> bool:
    if freeze == "frozen":
        return False
    return freeze == "all_trainable" if bn_trainable is None else bn_trainable


def phases(
    epochs: int,
    *,
    head_only_epochs: int = 0,
    freeze: FreezeMode = "all_trainable",
    top_k: int = 0,
    finetune_lr_factor: float = 0.1,
    bn_trainable: Optional[bool] = None,
) -> list[Phase]:
    """The training schedule over `epochs`: one phase, "train", with
    `head_only_epochs == 0` or `freeze == "frozen"`; else "warmup" (up to
    `head_only_epochs` head-only epochs), then "finetune" for the rest, if
    any, under `freeze` at `lr * finetune_lr_factor`."""
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0. Received: epochs={epochs}")
    bn = _bn_trainable(freeze, bn_trainable)
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
    """The backbone (the one nested model) of a `build_classifier` model
    or an `AdversarialModel` around one."""
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


def apply_freeze(
    model: keras.Model,
    freeze: FreezeMode,
    top_k: int = 0,
    bn_trainable: Optional[bool] = None,
) -> list[str]:
    """Sets the backbone's trainable flags and returns the names of its
    layers left trainable (the head stays trainable; recompile afterwards).

    "frozen": only the head trains; "top_k": the top `top_k` backbone layers
    with weights (BN included) train too; "all_trainable": everything. BN
    layers among them train per `bn_trainable` (None: only under
    "all_trainable").
    """
    if freeze not in ("all_trainable", "frozen", "top_k"):
        raise ValueError(
            f"freeze must be all_trainable, frozen or top_k. Received: freeze={freeze}"
        )
    if freeze == "top_k" and top_k < 1:
        raise ValueError(f"freeze=top_k needs top_k >= 1. Received: {top_k}")
    bn_trainable = _bn_trainable(freeze, bn_trainable)
    classifier = _classifier(model)
    backbone = get_backbone(classifier)
    classifier.trainable = True
    if freeze == "frozen":
        backbone.trainable = False
        return []
    # True on every container first: a parent that is not trainable hides
    # its trainable children from the optimizer.
    backbone.trainable = True
    # Leaf layers with weights an optimizer could train (BN included, fixed
    # preprocessing not), input to output.
    bn = keras.layers.BatchNormalization
    layers = [
        layer
        for layer in walk_layers(backbone)
        if not sublayers(layer) and (layer.trainable_weights or isinstance(layer, bn))
    ]
    first = 0 if freeze == "all_trainable" else len(layers) - top_k
    for i, layer in enumerate(layers):
        layer.trainable = i >= first and (bn_trainable or not isinstance(layer, bn))
    return [layer.name for layer in layers if layer.trainable]


def apply_phase(model: keras.Model, phase: Phase) -> list[str]:
    """`apply_freeze` with a `Phase`'s settings."""
    return apply_freeze(model, phase.freeze, phase.top_k, phase.bn_trainable)
