"""Workarounds for Keras bugs no public API avoids: the only module that
touches private Keras attributes. Each names its upstream issue, and
tests/test_keras_workarounds.py fails once the bug is fixed upstream.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def fit_under_multi_worker(
    model: keras.Model, strategy: tf.distribute.Strategy
) -> keras.Model:
    """Lets `model.fit` run under a MultiWorkerMirroredStrategy, where Keras
    3 fails twice (keras-team/keras#20585, TF 2.21 / Keras 3.15); call it
    after `compile`, which resets what it replaces:

    * the model is built from this worker's local batch, not one Keras
      all-reduces across workers (`_maybe_symbolic_build`);
    * the step's logs are averaged over all replicas (`axis=None`, as
      under MirroredStrategy), not reduced with `axis=0`.

    One step per call (`steps_per_execution=1`, see `plan_batches`).
    """

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, data in iterator:
                data_batch = tf.nest.map_structure(local, next(data))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    def step_function(step):
        @tf.function(reduce_retracing=True, jit_compile=model.jit_compile)
        def one_step(data):
            outputs = strategy.run(step, args=(data,))
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), outputs
            )

        return lambda iterator: one_step(next(iterator))

    # object.__setattr__: functions, not model state Keras should track.
    replacements = {
        "_maybe_symbolic_build": maybe_symbolic_build,
        "train_function": step_function(model.train_step),
        "test_function": step_function(model.test_step),
    }
    for name, value in replacements.items():
        object.__setattr__(model, name, value)
    return model
