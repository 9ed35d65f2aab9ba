"""The metrics `AdversarialModel` adds to the compiled ones, each logged
only where a step feeds it.

An `OptionalMetric` a step does not feed (no attack in training, a loss
hook that logs no parts) is not logged as 0. Inside a traced step it is
logged when that step called its `update_state` (`fed`, set at trace
time); eagerly (`get_metrics_result`) when it holds an update since its
last reset. Both give the same keys, with no mode flag.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
from keras import ops

from advtrain.models.trainers import metric_count, replicas_in_sync


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


def logged(metrics: Iterable[Any], results: dict, in_step: bool) -> dict:
    """`results` (metric name -> value) without the optional metrics that
    were not fed: by this step when `in_step` (traced), since the reset
    when eager."""
    skip = {
        m.name
        for m in metrics
        if isinstance(m, OptionalMetric)
        and not (m.fed if in_step else metric_count(m) > 0)
    }
    return {k: v for k, v in results.items() if k not in skip}


def batch_mean_share(values, sample_weight=None):
    """`AdversarialModel.reduce_per_example`."""
    values = ops.cast(values, "float32")
    rank = len(values.shape)
    if rank == 0:
        raise ValueError(
            "reduce_per_example needs one value per example, shape "
            f"[batch]. Received: shape={tuple(values.shape)}"
        )
    if rank > 1:
        values = ops.mean(values, axis=list(range(1, rank)))
    if sample_weight is not None:
        values = values * ops.reshape(ops.cast(sample_weight, "float32"), [-1])
    count = ops.cast(ops.shape(values)[0] * replicas_in_sync(), "float32")
    return ops.divide_no_nan(ops.sum(values), count)


def track_loss(tracker: keras.metrics.Mean, loss, batch) -> None:
    """Feeds Keras-style `loss`: the per-example mean over the global batch,
    from this replica's share `loss` of the batch `batch`."""
    tracker.update_state(
        ops.cast(loss, "float32") * replicas_in_sync(),
        sample_weight=ops.shape(batch)[0],
    )


def track_share(tracker: keras.metrics.Mean, share) -> None:
    """Feeds a loss share (`compute_loss`, `reduce_per_example`) as the
    per-example mean it stands for, the same on 1 or N replicas."""
    tracker.update_state(ops.cast(share, "float32") * replicas_in_sync())


def track_zero_gradients(tracker: keras.metrics.Mean, grad) -> None:
    """Feeds the share of input-gradient entries that are exactly zero:
    under float16 an unscaled loss underflows and FGSM silently stops."""
    tracker.update_state(ops.mean(ops.cast(ops.equal(grad, 0), "float32")))
