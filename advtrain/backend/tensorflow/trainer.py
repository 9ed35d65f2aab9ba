"""`AdversarialModel`'s step on TensorFlow: `tf.GradientTape`,
`tf.distribute`'s replicas and the fused BatchNorm kernel while a step
runs."""

from __future__ import annotations

import tensorflow as tf

# A step sees its replica's share of the batch (`tf.distribute`).
GLOBAL_BATCHES = False


def replicas_in_sync() -> int:
    return tf.distribute.get_strategy().num_replicas_in_sync


def metric_count(metric) -> float:
    # Under a strategy a sync-on-read variable, which `float` refuses; as a
    # tensor (cross-replica) it is the replicas' sum.
    return float(tf.convert_to_tensor(metric.count.value))


class AdversarialTrainer:
    """The TensorFlow half of `AdversarialModel` (placed before `keras.Model`)."""

    def train_step(self, data):
        return self._train_step(data)

    def test_step(self, data):
        return self._test_step(data)

    def _in_step(self) -> bool:
        return not tf.executing_eagerly()

    def value_and_gradients(self, loss_fn, inputs=()):
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            for tensor in inputs:
                tape.watch(tensor)
            loss, aux = loss_fn(*inputs)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, [*inputs, *variables])
        n = len(inputs)
        return loss, aux, gradients[:n], gradients[n:]

    def apply_gradients(self, gradients) -> None:
        variables = self.trainable_variables
        self.optimizer.apply_gradients(zip(gradients, variables))  # noqa: B905 (traced: autograph)

    def attack_step(self, generate):
        return generate()

    def make_train_function(self, force=False):
        return self._fused(super().make_train_function, "train_function", force)

    def make_test_function(self, force=False):
        return self._fused(super().make_test_function, "test_function", force)

    def _fused(self, make, name: str, force: bool):
        if getattr(self, name) is not None and not force:
            return getattr(self, name)
        make(force=force)
        step = getattr(self, name)
        kernel = self.fused_kernel_scope()  # the model's BatchNorm layers

        def function(iterator):
            with kernel():
                return step(iterator)

        setattr(self, name, function)
        return function
