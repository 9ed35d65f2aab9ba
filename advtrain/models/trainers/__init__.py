"""The part of `AdversarialModel`'s step that differs per Keras backend.

As Keras's own trainers, one module per backend; the steps themselves are
written once in `keras.ops`. A module supplies `AdversarialTrainer`, a
mixin placed before `keras.Model` (`train_step`/`test_step` around the
model's `_train_step`/`_test_step`, `value_and_gradients`,
`apply_gradients`, `attack_step`, `_in_step`), `replicas_in_sync()` and
`metric_count(metric)`.
"""

from __future__ import annotations

import importlib

import keras

BACKENDS = ("tensorflow", "jax")


def _module():
    name = keras.backend.backend()
    if name in BACKENDS:
        return importlib.import_module(f"advtrain.models.trainers.{name}")
    return importlib.import_module("advtrain.models.trainers.unsupported")


_backend = _module()
AdversarialTrainer = _backend.AdversarialTrainer
replicas_in_sync = _backend.replicas_in_sync
metric_count = _backend.metric_count

__all__ = ["AdversarialTrainer", "BACKENDS", "metric_count", "replicas_in_sync"]
