"""The part of `AdversarialModel`'s step that differs per Keras backend.

As Keras's own trainers, one module per backend supplies
`replicas_in_sync()`, `metric_count(metric)` and `AdversarialTrainer`, a
mixin placed before `keras.Model`: `train_step`/`test_step` around the
model's `_train_step`/`_test_step`; `value_and_gradients(loss_fn, inputs)`
-> `(loss, aux, input_grads, weight_grads)` for `loss_fn(*inputs) ->
(loss, aux)`, gradients of the optimizer-scaled loss; `apply_gradients`;
`attack_step(generate)`, the attack, whose BatchNorm updates JAX drops;
`_in_step()`.
"""

from __future__ import annotations

import importlib

import keras

BACKENDS = ("tensorflow", "jax")

if keras.backend.backend() in BACKENDS:
    _backend = importlib.import_module(
        f"advtrain.models.trainers.{keras.backend.backend()}"
    )
    AdversarialTrainer = _backend.AdversarialTrainer
    replicas_in_sync = _backend.replicas_in_sync
    metric_count = _backend.metric_count
else:

    class AdversarialTrainer:
        """Another backend (torch): the model builds, calls and saves;
        training says which backends train it, in one line."""

        def train_step(self, *args, **kwargs):
            raise NotImplementedError(
                f"{type(self).__name__} trains on the Keras backends "
                f"{', '.join(BACKENDS)} (set KERAS_BACKEND before importing "
                f"keras). Received: backend={keras.backend.backend()!r}"
            )

        test_step = train_step

    def replicas_in_sync() -> int:
        return 1

    def metric_count(metric) -> float:
        return float(keras.ops.convert_to_numpy(metric.count))


__all__ = ["AdversarialTrainer", "BACKENDS", "metric_count", "replicas_in_sync"]
