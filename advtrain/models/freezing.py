"""Freezing policy and the two-phase fine-tuning schedule.

What "frozen" means here, and why it is enforced with `trainable` rather
than `backbone(x, training=False)`: in Keras 3 the `training` value of the
outer call (True under `fit`) reaches nested layers, so a `training=False`
written into a functional graph does not keep a nested BatchNormalization
in inference mode once it is trainable (keras-team/keras#20285). A BN layer
whose own `trainable` is False, on the other hand, always normalises with
its moving statistics and never updates them. So:

- `frozen`: the whole backbone is non-trainable; its BN layers run in
  inference mode; only the head trains.
- `top_k`: the top `k` backbone layers that hold weights (counted from the
  output, BN layers included in the count) train with the head; the rest
  is frozen. BN layers among the top `k` stay frozen unless
  `model.batchnorm.trainable: true`.
- `all_trainable`: everything trains; BN layers too unless
  `model.batchnorm.trainable: false`.

The schedule: `phases(epochs, head_only_epochs=..., freeze=...)` splits
training into a head-only warmup of `head_only_epochs` epochs and a
fine-tune phase under `freeze` at `learning_rate * finetune_lr_factor`.
The runner calls, per phase:

```python
for phase in phases(epochs, head_only_epochs=2, freeze="top_k", top_k=10):
    apply_phase(classifier, phase)
    model.compile(optimizer=make_optimizer(lr * phase.lr_factor), ...)
    model.fit(..., initial_epoch=phase.start_epoch, epochs=phase.end_epoch)
```

`compile` must run after `apply_phase`: a compiled train step keeps the
trainable set it was built with. A fresh optimizer per phase is intended
(the set of trained variables changes).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import keras

from advtrain.models.batchnorm.policy import walk_layers

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
        bn_trainable: whether backbone BN layers train (resolved from
            `model.batchnorm.trainable`).
        lr_factor: multiply the recipe's learning rate by this.
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
    """`model.batchnorm.trainable` with None resolved for `freeze`."""
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
    """The training schedule: `epochs` (the recipe's `train.epochs`) and
    the recipe's model keys, with its defaults (`bn_trainable` is
    `model.batchnorm.trainable`).

    - `head_only_epochs == 0` or `freeze == "frozen"`: one phase, "train",
      under `freeze` at the recipe's learning rate.
    - otherwise: "warmup", `min(head_only_epochs, epochs)` head-only epochs
      at the recipe's learning rate, then "finetune" for the remaining
      epochs under `freeze` at `learning_rate * finetune_lr_factor`
      (omitted when no epoch remains).

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
    """The backbone inside a classifier built by `build_classifier`.

    Accepts the classifier or a model wrapping it in a `classifier`
    attribute (AdversarialModel). The backbone is the one nested model.
    """
    inner = getattr(model, "classifier", None)
    if isinstance(inner, keras.Model):
        model = inner
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if len(nested) != 1:
        raise ValueError(
            "Expected a classifier with exactly one nested backbone model. "
            f"Received: {model.name} with {len(nested)} nested models"
        )
    return nested[0]


def _weighted_layers(backbone: keras.Model) -> list[keras.layers.Layer]:
    # Leaf layers with weights an optimizer could train (BN included, fixed
    # preprocessing such as EfficientNet's Normalization not), input to
    # output. Only meaningful while the backbone is trainable.
    return [
        layer
        for layer in walk_layers(backbone)
        if not getattr(layer, "_layers", None)
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
    """Sets the backbone's trainable flags; the head stays trainable.

    Args:
        model: the classifier (or a model wrapping it).
        freeze: "all_trainable", "frozen" or "top_k".
        top_k: under "top_k", how many weighted backbone layers train.
        bn_trainable: whether BN layers among the trained ones train; None
            resolves as `resolve_bn_trainable`.

    Returns:
        Names of the backbone layers left trainable.

    Recompile the model afterwards.
    """
    if freeze not in ("all_trainable", "frozen", "top_k"):
        raise ValueError(
            f"freeze must be all_trainable, frozen or top_k. Received: freeze={freeze}"
        )
    if freeze == "top_k" and top_k < 1:
        raise ValueError(f"freeze=top_k needs top_k >= 1. Received: {top_k}")
    bn_trainable = resolve_bn_trainable(freeze, bn_trainable)
    inner = getattr(model, "classifier", None)
    classifier = inner if isinstance(inner, keras.Model) else model
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

    Recompile afterwards, with learning rate `lr * phase.lr_factor`.

    Example:

    ```python
    for phase in phases(5, head_only_epochs=2, freeze="all_trainable"):
        apply_phase(classifier, phase)
        classifier.compile(keras.optimizers.Adam(1e-3 * phase.lr_factor),
                           loss, metrics)
        classifier.fit(ds, initial_epoch=phase.start_epoch,
                       epochs=phase.end_epoch)
    ```
    """
    return apply_freeze(model, phase.freeze, phase.top_k, phase.bn_trainable)
