"""`AdversarialModel` on a Keras backend it does not train on (torch,
numpy, openvino): the model builds, calls and saves; `fit` and `evaluate`
say which backends train it, in one line."""

from __future__ import annotations

import keras


def replicas_in_sync() -> int:
    return 1


def metric_count(metric) -> float:
    return float(keras.ops.convert_to_numpy(metric.count))


class AdversarialTrainer:
    """Refuses to train: see the module docstring."""

    def _refuse(self, *args, **kwargs):
        from advtrain.models.trainers import BACKENDS

        raise NotImplementedError(
            f"{type(self).__name__} trains on the Keras backends "
            f"{', '.join(BACKENDS)} (set KERAS_BACKEND before importing "
            f"keras). Received: backend={keras.backend.backend()!r}"
        )

    train_step = test_step = _refuse
