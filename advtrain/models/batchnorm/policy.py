"""BatchNorm policy: momentum from the run's length, recalibration and the
train/inference accuracy gap (docs/batchnorm.md).

With Keras's default momentum 0.99 a short run ends with moving statistics
that lag the weights. Before training, `apply_batchnorm_policy`; after,
`settle_batchnorm` measures `bn_gap` and recalibrates when it is large.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union

import keras
import numpy as np

from advtrain import backend
from advtrain.models.batchnorm.fused import fuse_batchnorm
from advtrain.models.batchnorm.walk import batchnorm_layers, walk_layers
from advtrain.utils.errors import ArgumentError
from advtrain.utils.progress import Echo

# Momentum words of 0.2: a saved 0.2 config is mapped, anything else refused.
RENAMED_MOMENTUM = {"adapt": "auto"}
# `settle_batchnorm`'s policy keywords, as `BatchNormOptions` names them.
SETTLE_KEYS = ("recalibrate", "gap_threshold", "recalibrate_batches")
# "auto" treats a layer still at Keras's default as not chosen by anyone.
KERAS_DEFAULT_MOMENTUM = 0.99


def check_momentum(momentum: Any, name: str = "momentum") -> None:
    """The one rule for a momentum setting: "auto", a number in (0, 1) or
    None; else a ValueError naming `name`."""
    number = isinstance(momentum, (int, float)) and not isinstance(momentum, bool)
    if momentum is None or (number and 0.0 < momentum < 1.0):
        return
    if isinstance(momentum, str) and momentum == "auto":
        return
    if isinstance(momentum, str) and momentum in RENAMED_MOMENTUM:
        raise ArgumentError(
            name,
            f"{momentum!r} was renamed {RENAMED_MOMENTUM[momentum]!r} in 0.3 "
            f"(the same rule). Received: {name}={momentum!r}",
        )
    raise ArgumentError(
        name,
        f"must be 'auto', a number in (0, 1) or None. Received: {name}={momentum!r}",
    )


def auto_momentum(total_steps: Optional[int]) -> float:
    """BN momentum for a run of `total_steps` training steps.

    The moving average spans 5% of the run, clamped to [0.9, 0.99]; runs
    under ~45 steps go lower (not below 0.5) so the initial statistics
    weigh at most 1% at the end. Unknown length (None): 0.9. E.g. 66
    steps: 0.9; 1,000: 0.98; 100,000: 0.99.
    """
    if total_steps is None:
        return 0.9
    if total_steps < 1:
        raise ValueError(
            f"total_steps must be >= 1. Received: total_steps={total_steps}"
        )
    momentum = min(max(1.0 - 1.0 / max(0.05 * total_steps, 1.0), 0.9), 0.99)
    fade = 0.01 ** (1.0 / total_steps)
    return round(max(min(momentum, fade), 0.5), 4)


def set_momentum(
    model: keras.layers.Layer,
    momentum: Union[str, float, None],
    total_steps: Optional[int] = None,
) -> Optional[str]:
    """Sets the BN momentum: "auto" gives the layers still at 0.99 the
    momentum for a run of `total_steps` (None: unknown); a number sets
    every layer; None keeps them. Returns a note when "auto" changed
    layers."""
    check_momentum(momentum)
    if momentum == "auto":
        return _follow_run_length(model, total_steps)
    if momentum is not None:
        for layer in batchnorm_layers(model):
            layer.momentum = float(momentum)
    return None


def apply_batchnorm_policy(
    model: keras.layers.Layer,
    *,
    total_steps: Optional[int] = None,
    momentum: Union[str, float, None] = "auto",
    fused_kernel: bool = True,
) -> Optional[str]:
    """Before `compile`/`fit`: with `fused_kernel`, plain Keras BN layers
    switch to the fused kernel for good; then `set_momentum`, whose note it
    returns."""
    check_momentum(momentum)
    if fused_kernel:
        fuse_batchnorm(model)
    return set_momentum(model, momentum, total_steps)


def _follow_run_length(
    model: keras.layers.Layer, total_steps: Optional[int]
) -> Optional[str]:
    momentum = auto_momentum(total_steps)
    layers = [
        layer
        for layer in batchnorm_layers(model)
        if layer.momentum == KERAS_DEFAULT_MOMENTUM
    ]
    if not layers or momentum == KERAS_DEFAULT_MOMENTUM:
        return None
    for layer in layers:
        layer.momentum = momentum
    length = "of unknown length" if total_steps is None else f"of {total_steps} steps"
    return (
        f"BatchNorm: momentum {KERAS_DEFAULT_MOMENTUM} (Keras's default) -> "
        f"{momentum:g} on {len(layers)} layer(s) for a run {length}, so the "
        "moving statistics keep up with the weights (layers set to another "
        "momentum are kept)."
    )


def fit_total_steps(
    x: Any = None,
    batch_size: Optional[int] = None,
    epochs: int = 1,
    steps_per_epoch: Optional[int] = None,
    initial_epoch: int = 0,
    validation_split: float = 0.0,
) -> Optional[int]:
    """The training steps a `keras.Model.fit` call with these arguments
    runs, or None when its data has no known length."""
    steps = steps_per_epoch
    if steps is None and backend.is_dataset(x):
        steps = max(int(x.cardinality()), 0)
    elif steps is None and hasattr(x, "__getitem__"):  # a PyDataset too
        first = x
        if isinstance(x, dict):
            first = next(iter(x.values()), None)
        elif isinstance(x, (list, tuple)) and x:
            first = x[0]
        try:
            steps = len(first)
        except TypeError:
            return None
        if not isinstance(x, keras.utils.PyDataset):
            steps = -(-int(steps * (1.0 - validation_split)) // (batch_size or 32))
    if not steps:
        return None
    return int(steps) * max(1, int(epochs) - int(initial_epoch))


def _batch_inputs(batch: Any) -> Any:
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch["x"] if isinstance(batch, dict) and "x" in batch else batch


def recalibrate_batchnorm(
    model: keras.Model,
    dataset: Iterable,
    num_batches: int = 50,
    include_frozen: bool = False,
) -> int:
    """Re-estimates BN moving mean and variance from clean training data.

    The new statistics are the plain average of the per-batch statistics
    over the first `num_batches` batches (`x` or `(x, y, ...)`, of the
    training batch size); nothing else in the model changes. Frozen BN
    layers only with `include_frozen`. Returns the number of batches
    averaged; a ValueError for `num_batches < 1` or no batch.
    """
    if num_batches < 1:
        raise ValueError(
            f"num_batches must be >= 1. Received: num_batches={num_batches}"
        )
    all_bn = batchnorm_layers(model)
    layers = [layer for layer in all_bn if include_frozen or layer.trainable]
    if not layers:
        return 0
    saved = [(layer, layer.momentum, layer.trainable) for layer in layers]
    sums = [np.zeros((2, *layer.moving_mean.shape)) for layer in layers]
    count = 0
    try:
        with _statistics_kept([layer for layer in all_bn if layer not in layers]):
            # At momentum 0 the moving statistics become each batch's; a
            # frozen layer computes batch statistics only once trainable.
            for layer in layers:
                layer.momentum, layer.trainable = 0.0, True
            for batch in itertools.islice(dataset, num_batches):
                model(_batch_inputs(batch), training=True)
                for layer, total in zip(layers, sums, strict=True):
                    total += (layer.moving_mean.numpy(), layer.moving_variance.numpy())
                count += 1
    finally:
        for layer, momentum, trainable in saved:
            layer.momentum, layer.trainable = momentum, trainable
    if count == 0:
        raise ValueError("recalibrate_batchnorm: the dataset yielded no batch.")
    for layer, (mean_sum, var_sum) in zip(layers, sums, strict=True):
        layer.moving_mean.assign((mean_sum / count).astype("float32"))
        layer.moving_variance.assign((var_sum / count).astype("float32"))
    return count


@contextlib.contextmanager
def _statistics_kept(layers: list):
    kept = [
        (layer, layer.moving_mean.numpy(), layer.moving_variance.numpy())
        for layer in layers
    ]
    try:
        yield
    finally:
        for layer, mean, variance in kept:
            layer.moving_mean.assign(mean)
            layer.moving_variance.assign(variance)


def _accuracy(logits: np.ndarray, y: Any) -> float:
    y = np.asarray(y)
    if y.ndim == logits.ndim:  # one-hot
        y = y.argmax(axis=-1)
    return float(np.mean(logits.argmax(axis=-1) == y.reshape(-1)))


def bn_gap(
    model: keras.Model, x: Any, y: Any, batch_size: Optional[int] = None
) -> dict[str, float]:
    """Accuracy with BN in training mode vs inference mode on one batch set.

    `x`, `y`: held-out images and integer or one-hot labels, in batches
    of `batch_size` as in training (None: one batch). Dropout is off for
    both passes; the moving statistics are restored afterwards. Returns
    dict(train_mode_accuracy, inference_mode_accuracy, gap = train -
    inference).
    """
    x = np.asarray(x)
    if len(x) == 0:
        raise ValueError("bn_gap needs at least one example. Received: 0")
    step = batch_size or len(x)
    dropouts = [
        (layer, layer.rate)
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.Dropout)
    ]
    accuracy = {}
    try:
        with _statistics_kept(batchnorm_layers(model)):
            for layer, _ in dropouts:
                layer.rate = 0.0
            for training in (True, False):
                logits = [
                    keras.ops.convert_to_numpy(
                        model(x[i : i + step], training=training)
                    )
                    for i in range(0, len(x), step)
                ]
                accuracy[training] = _accuracy(np.concatenate(logits), y)
    finally:
        for layer, rate in dropouts:
            layer.rate = rate
    return {
        "train_mode_accuracy": accuracy[True],
        "inference_mode_accuracy": accuracy[False],
        "gap": accuracy[True] - accuracy[False],
    }


def bn_gap_warning(
    gap: float,
    threshold: float = 0.05,
    momentum: Optional[float] = None,
    recalibrated: bool = False,
    names: Optional[Mapping[str, str]] = None,
) -> Optional[str]:
    """A one-line warning when the BN gap exceeds `threshold`, else None.

    The advice follows the setting: a lower `momentum` than the one in use
    (None: unknown), recalibration unless it ran, or a larger batch. It
    names the settings `momentum`, `recalibrate` and `batch_size` as
    `names` maps them (the caller's names for them).
    """
    if abs(gap) <= threshold:
        return None
    names = names or {}
    batch_size = names.get("batch_size", "batch_size")
    if gap <= 0:
        cause = (
            "inference-mode accuracy exceeds training-mode accuracy by "
            f"{-gap:.3f} (threshold {threshold:.3f}): batch statistics are "
            "noisy"
        )
        return f"BatchNorm gap: {cause}. Fix: a larger {batch_size}."
    cause = (
        "training-mode accuracy exceeds inference-mode accuracy by "
        f"{gap:.3f} (threshold {threshold:.3f}): the BN moving "
        "statistics do not match the batch statistics"
    )
    if recalibrated:
        fix = (
            f"a larger {batch_size} (per-batch statistics vary between batches) "
            "or held-out data closer to the training data"
        )
        return (
            f"BatchNorm gap: {cause} even after recalibration on clean training "
            f"data. Fix: {fix}."
        )
    lower = (
        0.9
        if momentum is None or momentum > 0.9
        else round(max(0.5, 1 - 2 * (1 - momentum)), 4)
    )
    now = "" if momentum is None else f" (now {momentum:g})"
    return (
        f"BatchNorm gap: {cause}. Fix: {names.get('momentum', 'momentum')}: "
        f"{lower:g}{now}; or {names.get('recalibrate', 'recalibrate')}: true to "
        "re-estimate the statistics on clean training data after training."
    )


def layer_momentum(model: keras.layers.Layer) -> Optional[float]:
    """The largest momentum among `model`'s trainable BN layers (None: no
    such layer), the one a gap warning talks about."""
    momenta = [layer.momentum for layer in batchnorm_layers(model) if layer.trainable]
    return max(momenta) if momenta else None


def settle_batchnorm(
    model: keras.Model,
    x: Any,
    y: Any,
    batch_size: int,
    train_batches: Iterable,
    *,
    recalibrate: Union[bool, str] = "auto",
    gap_threshold: float = 0.05,
    recalibrate_batches: int = 50,
    echo: Optional[Echo] = None,
    names: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """After training: measure the BN gap on held-out `x`, `y` (in batches
    of the per-replica training `batch_size`), recalibrate the trainable BN
    layers on `train_batches` when `recalibrate` says so ("auto": when
    |gap| > `gap_threshold`), measure again.

    Returns `bn_gap`'s dict for the final weights, plus `recalibrated`
    (batches averaged, 0 if none), `before` (the gap right after training)
    and `warning` (`bn_gap_warning`'s line, named per `names`, or None);
    `echo` receives the gap line and the warning.
    """
    before = bn_gap(model, x, y, batch_size=batch_size)
    trains_bn = any(layer.trainable for layer in batchnorm_layers(model))
    wanted = recalibrate is True or (
        recalibrate == "auto" and abs(before["gap"]) > gap_threshold
    )
    after, batches = before, 0
    if wanted and trains_bn:
        batches = recalibrate_batchnorm(
            model, train_batches, num_batches=recalibrate_batches
        )
        after = bn_gap(model, x, y, batch_size=batch_size)
    warning = bn_gap_warning(
        after["gap"],
        gap_threshold,
        momentum=layer_momentum(model),
        recalibrated=batches > 0,
        names=names,
    )
    if echo is not None:
        line = f"bn_gap: {100 * after['gap']:+.2f} points"
        if batches:
            line += (
                f" after recalibrating on {batches} clean training batch(es) "
                f"({100 * before['gap']:+.2f} before)"
            )
        echo(line)
        if warning:
            echo(f"warning: {warning}")
    return {**after, "recalibrated": batches, "before": before, "warning": warning}
