"""The part of `AdversarialModel`'s step that differs per Keras backend.

Keras's own trainer has this shape (one `Trainer`, one small trainer per
backend: `keras/src/backend/{tensorflow,jax}/trainer.py`). The steps
themselves (`advtrain.models.reuse_gradient`,
`advtrain.models.attack_then_train`, the hooks, the metrics) are written
once in `keras.ops`; each backend module supplies what they cannot say
backend-neutrally:

* `AdversarialTrainer`, a mixin placed before `keras.Model`: `train_step`
  and `test_step` in the backend's signature around the model's
  `_train_step(data)` / `_test_step(data)`; `value_and_gradients` (a loss
  and its gradients with respect to the weights and given inputs, loss
  scaling included); `apply_gradients`; `attack_step` (the attack's
  passes, whose state updates other than its random stream are dropped
  on JAX); `_attach_input_checks`; the train function that raises a
  failed input check's one-line error; `_in_step` (inside a traced step);
* `replicas_in_sync()` and `metric_count(metric)`.

`tensorflow` is today's step (`tf.GradientTape`, `tf.distribute`, the
fused BatchNorm kernel); `jax` is stateless (`keras.StatelessScope`,
`jax.value_and_grad`, the non-trainable variables threaded through).
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
