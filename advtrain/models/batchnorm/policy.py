"""BatchNorm policy: momentum from the run's length, recalibration and the
train/inference accuracy gap (docs/batchnorm.md).

With Keras's default momentum 0.99 a short run ends with moving statistics
that lag the weights: accurate in training mode, poor in inference mode.
Before training, `apply_batchnorm_policy` sets the fused kernel and the
momentum ("auto": layers still at 0.99 get `auto_momentum` of the run's
length; a number; None keeps them). After training, `settle_batchnorm`
measures `bn_gap`, recalibrates when it is large and says so. Which BN
layers train at all is `advtrain.models.freezing`'s business.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union

import keras
import numpy as np

from advtrain.models.batchnorm.fused import fuse_batchnorm
from advtrain.models.batchnorm.walk import batchnorm_layers, walk_layers
from advtrain.utils.errors import ArgumentError
from advtrain.utils.progress import Echo

MOMENTUM_RULES = ("auto",)
# Momentum words of 0.2: a saved 0.2 config is mapped, anything else refused.
RENAMED_MOMENTUM = {"adapt": "auto"}
# `settle_batchnorm`'s policy keywords, as `BatchNormOptions` names them.
SETTLE_KEYS = ("recalibrate", "gap_threshold", "recalibrate_batches")
# "auto" treats a layer still at Keras's default as not chosen by anyone.
KERAS_DEFAULT_MOMENTUM = 0.99
# Share of the run's steps the moving average spans, and the clamp.
HORIZON_FRACTION = 0.05
MOMENTUM_RANGE = (0.9, 0.99)
# A run too short for the clamp still lets its initial statistics (mean 0,
# variance 1) fade to this weight by the end, down to momentum 0.5.
INITIAL_WEIGHT = 0.01


def check_momentum(momentum: Any, name: str = "momentum") -> None:
    """The one rule for a momentum setting: "auto", a number in (0, 1) or
    None; else a ValueError naming `name`."""
    number = isinstance(momentum, (int, float)) and not isinstance(momentum, bool)
    if momentum is None or (number and 0.0 < momentum < 1.0):
        return
    if isinstance(momentum, str) and momentum in MOMENTUM_RULES:
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
    weigh at most 1% at the end. Unknown length (None): 0.9.

    Example:

    ```python
    auto_momentum(66)      # 0.9: 3 epochs of 22 steps
    auto_momentum(1_000)   # 0.98
    auto_momentum(100_000) # 0.99
    ```
    """
    if total_steps is None:
        return MOMENTUM_RANGE[0]
    if total_steps < 1:
        raise ValueError(
            f"total_steps must be >= 1. Received: total_steps={total_steps}"
        )
    horizon = HORIZON_FRACTION * total_steps
    low, high = MOMENTUM_RANGE
    momentum = min(max(1.0 - 1.0 / max(horizon, 1.0), low), high)
    fade = INITIAL_WEIGHT ** (1.0 / total_steps)
    return round(max(min(momentum, fade), 0.5), 4)


def set_momentum(
    model: keras.layers.Layer,
    momentum: Union[str, float, None],
    total_steps: Optional[int] = None,
) -> Optional[str]:
    """Sets the BN momentum: "auto" gives the layers still at 0.99 the
    momentum for a run of `total_steps` (None: unknown); a number sets
    every layer; None keeps them. Returns a one-line note when "auto"
    changed layers, else None.

    """
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
    """The policy before training: with `fused_kernel`, plain Keras BN
    layers switch to the fused kernel for good; then `set_momentum`, whose
    note it returns. Call it before `compile`/`fit`.

    Example:

    ```python
    apply_batchnorm_policy(classifier, total_steps=660, momentum="auto")
    classifier.compile(...)
    ```
    """
    check_momentum(momentum)
    if fused_kernel:
        fuse_batchnorm(model)
    return set_momentum(model, momentum, total_steps)


def _follow_run_length(
    model: keras.layers.Layer, total_steps: Optional[int]
) -> Optional[str]:
    # "auto": the layers still at Keras's 0.99 follow the run's length.
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
    tf = sys.modules.get("tensorflow")  # a tf.data.Dataset needs it loaded
    steps = steps_per_epoch
    if steps is None:
        if tf is not None and isinstance(x, tf.data.Dataset):
            cardinality = int(x.cardinality())
            steps = cardinality if cardinality >= 0 else None
        elif isinstance(x, keras.utils.PyDataset) or hasattr(x, "__getitem__"):
            first = x
            if isinstance(x, dict):
                first = next(iter(x.values()), None)
            elif isinstance(x, (list, tuple)) and x:
                first = x[0]
            try:
                n = len(first)
            except TypeError:
                return None
            if isinstance(x, keras.utils.PyDataset):
                steps = n
            else:
                n = int(n * (1.0 - validation_split))
                steps = -(-n // (batch_size or 32))
    if not steps:
        return None
    return int(steps) * max(1, int(epochs) - int(initial_epoch))


def _batch_inputs(batch: Any) -> Any:
    if isinstance(batch, (tuple, list)):
        return batch[0]
    if isinstance(batch, dict) and "x" in batch:
        return batch["x"]
    return batch


def recalibrate_batchnorm(
    model: keras.Model,
    dataset: Iterable,
    num_batches: int = 50,
    include_frozen: bool = False,
) -> int:
    """Re-estimates BN moving mean and variance from clean training data.

    The new statistics are the plain average of the per-batch statistics
    over up to `num_batches` batches (`x` or `(x, y, ...)`, of the training
    batch size); nothing else in the model changes. Frozen BN layers only
    with `include_frozen`. Returns the number of batches averaged; a
    ValueError for `num_batches < 1` or no batch.
    """
    if num_batches < 1:
        raise ValueError(
            f"num_batches must be >= 1. Received: num_batches={num_batches}"
        )
    all_bn = batchnorm_layers(model)
    layers = [layer for layer in all_bn if include_frozen or layer.trainable]
    if not layers:
        return 0
    untouched = [layer for layer in all_bn if layer not in layers]
    with _batch_statistics_mode(layers, untouched):
        sums, count = _sum_batch_statistics(model, layers, dataset, num_batches)
    if count == 0:
        raise ValueError("recalibrate_batchnorm: the dataset yielded no batch.")
    for layer, (mean_sum, var_sum) in zip(layers, sums, strict=True):
        layer.moving_mean.assign((mean_sum / count).astype("float32"))
        layer.moving_variance.assign((var_sum / count).astype("float32"))
    return count


@contextlib.contextmanager
def _batch_statistics_mode(layers: list, untouched: list):
    """`layers` trainable at momentum 0 (their moving statistics become
    each batch's); on exit their settings, and the `untouched` layers'
    statistics, are restored."""
    saved = [(layer, layer.momentum, layer.trainable) for layer in layers]
    # A frozen BN layer only computes batch statistics once trainable;
    # setting it on the layer alone leaves its parents as they are.
    try:
        with _statistics_kept(untouched):
            for layer in layers:
                layer.momentum = 0.0
                layer.trainable = True
            yield
    finally:
        for layer, momentum, trainable in saved:
            layer.momentum = momentum
            layer.trainable = trainable


@contextlib.contextmanager
def _statistics_kept(layers: list):
    """On exit, `layers`' moving statistics are as on entry."""
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


def _sum_batch_statistics(model, layers, dataset, num_batches):
    """Sums of each layer's per-batch mean and variance over up to
    `num_batches` batches, and how many batches were summed."""
    sums = [
        [np.zeros(layer.moving_mean.shape, "float64") for _ in range(2)]
        for layer in layers
    ]
    count = 0
    for batch in dataset:
        if count >= num_batches:
            break
        model(_batch_inputs(batch), training=True)
        for layer, (mean_sum, var_sum) in zip(layers, sums, strict=True):
            mean_sum += layer.moving_mean.numpy()
            var_sum += layer.moving_variance.numpy()
        count += 1
    return sums, count


def _accuracy(logits: np.ndarray, y: np.ndarray) -> float:
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
    n = len(x)
    if n == 0:
        raise ValueError("bn_gap needs at least one example. Received: 0")
    step = batch_size or n
    dropouts = [
        (layer, layer.rate)
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.Dropout)
    ]
    outputs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    try:
        with _statistics_kept(batchnorm_layers(model)):
            for layer, _ in dropouts:
                layer.rate = 0.0
            for training in (True, False):
                for start in range(0, n, step):
                    logits = model(x[start : start + step], training=training)
                    outputs[training].append(keras.ops.convert_to_numpy(logits))
    finally:
        for layer, rate in dropouts:
            layer.rate = rate
    train_acc = _accuracy(np.concatenate(outputs[True]), y)
    infer_acc = _accuracy(np.concatenate(outputs[False]), y)
    return {
        "train_mode_accuracy": train_acc,
        "inference_mode_accuracy": infer_acc,
        "gap": train_acc - infer_acc,
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
    if gap > 0:
        cause = (
            "training-mode accuracy exceeds inference-mode accuracy by "
            f"{gap:.3f} (threshold {threshold:.3f}): the BN moving "
            "statistics do not match the batch statistics"
        )
        fixes = []
        if not recalibrated:
            lower = (
                0.9
                if momentum is None or momentum > 0.9
                else round(max(0.5, 1 - 2 * (1 - momentum)), 4)
            )
            now = "" if momentum is None else f" (now {momentum:g})"
            fixes.append(f"{names.get('momentum', 'momentum')}: {lower:g}{now}")
            fixes.append(
                f"{names.get('recalibrate', 'recalibrate')}: true to re-estimate "
                "the statistics on clean training data after training"
            )
        else:
            cause += " even after recalibration on clean training data"
            fixes.append(
                f"a larger {batch_size} (per-batch statistics vary "
                "between batches) or held-out data closer to the training "
                "data"
            )
    else:
        cause = (
            "inference-mode accuracy exceeds training-mode accuracy by "
            f"{-gap:.3f} (threshold {threshold:.3f}): batch statistics are "
            "noisy"
        )
        fixes = [f"a larger {batch_size}"]
    return f"BatchNorm gap: {cause}. Fix: {'; or '.join(fixes)}."


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
    """After training: measure the BN gap, recalibrate when the policy
    says so, measure again.

    Args:
        model: the classifier.
        x, y: held-out images and labels for `bn_gap`.
        batch_size: the per-replica training batch, for `bn_gap`.
        train_batches: clean training batches for `recalibrate_batchnorm`.
        recalibrate: "auto" (when |gap| > `gap_threshold`), True or False;
            only trainable BN layers are recalibrated.
        gap_threshold, recalibrate_batches: the rest of `SETTLE_KEYS`.
        echo: receives the gap line and the warning, if any (None: silent).
        names: the settings' names in the warning (`bn_gap_warning`).

    Returns:
        `bn_gap`'s dict for the final weights, plus `recalibrated` (batches
        averaged, 0 if none), `before` (the gap right after training) and
        `warning` (None or `bn_gap_warning`'s line).

    Example:

    ```python
    report = settle_batchnorm(classifier, x_val, y_val, 64, train_ds)
    report["before"]["gap"], report["gap"]
    ```
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
