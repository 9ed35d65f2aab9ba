"""The metrics `AdversarialModel` adds to the compiled ones, and the rule
that logs each only where a step feeds it.

`clean_loss`, `adv_loss`, `adv_accuracy` and `zero_grad_fraction` are
`OptionalMetric`s: a step that has nothing to say about one (no attack in
training, a loss hook that logs no parts, a multi-step attack's gradient)
must not log it as 0, in its per-batch logs or in the epoch's. The train
and test steps feed different sets (`val_grad_align_loss` must not exist),
so the rule reads the metric itself, never the phase:

* inside a step's graph (`compute_metrics`), a metric is logged when the
  step being traced called its `update_state` (`fed`, set at trace time;
  no cost per batch);
* eagerly (Keras's end-of-epoch and end-of-evaluation
  `get_metrics_result`), when it holds any update since its last reset
  (`count > 0`). Keras resets every metric when training or evaluation
  begins, so this is the set the phase that just ran fed.

Both give the same keys, so the step's logs and `get_metrics_result` agree
whichever of the two Keras reports, with no mode flag and no assumption
about which Keras method runs validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf


def replicas_in_sync() -> int:
    """Replicas that each compute a share of the step (1 without tf.distribute)."""
    return tf.distribute.get_strategy().num_replicas_in_sync


class OptionalMetric:
    """A `keras.metrics.Mean`-based metric logged only where a step feeds it.

    Example:

    ```python
    class MyModel(AdversarialModel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.margin_tracker = OptionalMean(name="margin")
    ```
    """

    fed = False

    def update_state(self, *args, **kwargs):
        self.fed = True  # read while the same step is traced (`logged`)
        return super().update_state(*args, **kwargs)


class OptionalMean(OptionalMetric, keras.metrics.Mean):
    """`keras.metrics.Mean`, logged only where a step feeds it."""


class OptionalAccuracy(OptionalMetric, keras.metrics.SparseCategoricalAccuracy):
    """`keras.metrics.SparseCategoricalAccuracy`, logged only where fed."""


def begin_step(metrics: Iterable[Any]) -> None:
    """Called as a step starts tracing: no optional metric is fed yet."""
    for metric in metrics:
        if isinstance(metric, OptionalMetric):
            metric.fed = False


def logged(metrics: Iterable[Any], results: dict) -> dict:
    """`results` (metric name -> value) without the optional metrics that
    were not fed: by this step when traced, since the reset when eager."""
    eager = tf.executing_eagerly()
    skip = {
        m.name
        for m in metrics
        if isinstance(m, OptionalMetric) and not (_count(m) > 0 if eager else m.fed)
    }
    return {k: v for k, v in results.items() if k not in skip}


def _count(metric) -> float:
    # Under a strategy the count is a sync-on-read variable, which `float`
    # refuses; read as a tensor (cross-replica) it is the replicas' sum.
    return float(tf.convert_to_tensor(metric.count.value))


def batch_mean_share(values, sample_weight=None) -> tf.Tensor:
    """This replica's share of the batch mean of a per-example term
    (`AdversarialModel.reduce_per_example`)."""
    values = tf.cast(values, tf.float32)
    if values.shape.rank is None or values.shape.rank == 0:
        raise ValueError(
            "reduce_per_example needs one value per example, shape "
            f"[batch]. Received: shape={values.shape}"
        )
    if values.shape.rank > 1:
        values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    if sample_weight is not None:
        values = values * tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
    count = tf.cast(tf.shape(values)[0] * replicas_in_sync(), tf.float32)
    return tf.math.divide_no_nan(tf.reduce_sum(values), count)


def track_loss(tracker: keras.metrics.Mean, loss, batch) -> None:
    """Feeds Keras-style `loss`: the per-example mean over the global batch,
    from this replica's share `loss` of the batch `batch`."""
    tracker.update_state(
        tf.cast(loss, tf.float32) * replicas_in_sync(),
        sample_weight=tf.shape(batch)[0],
    )


def track_share(tracker: keras.metrics.Mean, share) -> None:
    """Feeds a loss share (`compute_loss`, `reduce_per_example`) as the
    per-example mean it stands for, the same on 1 or N replicas."""
    tracker.update_state(tf.cast(share, tf.float32) * replicas_in_sync())


def track_zero_gradients(tracker: keras.metrics.Mean, grad) -> None:
    """Feeds the share of input-gradient entries that are exactly zero:
    under float16 an unscaled loss underflows and FGSM silently stops."""
    tracker.update_state(tf.reduce_mean(tf.cast(tf.equal(grad, 0), tf.float32)))
