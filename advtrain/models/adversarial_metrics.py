"""The metrics `AdversarialModel` adds to the compiled ones, each logged
only where a step feeds it: inside a traced step when that step called its
`update_state` (`fed`, set at trace time), eagerly when it holds an update
since its last reset. Both give the same keys, with no mode flag.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
from keras import ops

from advtrain.backend import metric_count, replicas_in_sync


class OptionalMetric:
    """A Keras metric mixin: logged only where a step feeds it (as
    `GradAlign`'s `OptionalMean(name="grad_align_loss")`)."""

    fed = False

    def update_state(self, *args, **kwargs):
        self.fed = True  # read while the same step is traced (`logged`)
        return super().update_state(*args, **kwargs)


class OptionalMean(OptionalMetric, keras.metrics.Mean):
    """`keras.metrics.Mean`, logged only where a step feeds it."""


class OptionalAccuracy(OptionalMetric, keras.metrics.SparseCategoricalAccuracy):
    """`keras.metrics.SparseCategoricalAccuracy`, logged only where fed."""


def begin_step(metrics: Iterable[Any]) -> None:
    for metric in metrics:
        if isinstance(metric, OptionalMetric):
            metric.fed = False


def logged(metrics: Iterable[Any], results: dict, in_step: bool) -> dict:
    """`results` without the optional metrics not fed (by this step when
    `in_step`, since the reset when eager)."""
    skip = {
        m.name
        for m in metrics
        if isinstance(m, OptionalMetric)
        and not (m.fed if in_step else metric_count(m) > 0)
    }
    return {k: v for k, v in results.items() if k not in skip}


def track_loss(tracker: keras.metrics.Mean, loss, batch) -> None:
    """Feeds Keras-style `loss`, the per-example mean over the global batch,
    from this replica's share `loss` of the batch `batch`."""
    tracker.update_state(global_mean(loss), sample_weight=ops.shape(batch)[0])


def global_mean(share) -> Any:
    """The per-example mean over the global batch from this replica's
    share of it, in float32 (on one replica the share itself: an eager
    step pays per op)."""
    share = ops.cast(share, "float32")
    replicas = replicas_in_sync()
    return share if replicas == 1 else share * replicas


def track_zero_gradients(tracker: keras.metrics.Mean, grad) -> None:
    # Under float16 an unscaled loss underflows and FGSM silently stops.
    tracker.update_state(ops.mean(ops.cast(ops.equal(grad, 0), "float32")))
