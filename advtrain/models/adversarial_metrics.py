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
from keras import ops

from advtrain.models.trainers import metric_count, replicas_in_sync

__all__ = [
    "OptionalAccuracy",
    "OptionalMean",
    "OptionalMetric",
    "batch_mean_share",
    "begin_step",
    "logged",
    "replicas_in_sync",
    "track_loss",
    "track_share",
    "track_zero_gradients",
]


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
    """This replica's share of the batch mean of a per-example term
    (`AdversarialModel.reduce_per_example`)."""
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
