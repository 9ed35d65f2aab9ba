"""BatchNorm policy: momentum override, recalibration and the train/inference
accuracy gap.

Keras BatchNormalization keeps exponential moving averages of the batch
mean and variance (`moving = momentum * moving + (1 - momentum) * batch`).
With the default momentum 0.99 the averages need a few hundred steps to
forget their initial values, so a short fine-tune ends with moving
statistics that lag the weights: the model is accurate in training mode
(batch statistics) and poor in inference mode (moving statistics). The
runner therefore:

1. `apply_batchnorm_policy(model, cfg.batchnorm)` before compiling
   (momentum override on every BN layer, nested ones included);
2. trains;
3. `recalibrate_batchnorm(model, clean_train_ds, cfg.batchnorm.
   recalibrate_batches)` when `cfg.batchnorm.recalibrate` is set;
4. `bn_gap(model, x_val, y_val, batch_size)` and prints
   `bn_gap_warning(gap, cfg.batchnorm.gap_threshold)` when it is not None.

Which BN layers train at all is the freezing policy's business
(`advtrain.models.freezing`): a BN layer with `trainable=False` runs in
inference mode even when the model is called with `training=True`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Optional

import keras
import numpy as np

from advtrain.config import BatchNormConfig


def walk_layers(layer: keras.layers.Layer) -> Iterator[keras.layers.Layer]:
    """Yields every layer below `layer` depth first, in model order.

    Descends into nested models and into custom layers that own sublayers,
    which `Model.layers` does not; each layer is yielded once.
    """
    seen: set[int] = set()

    def visit(node):
        # `_layers` is how Keras tracks sublayers of any layer; the public
        # `Model.layers` stops at the first level.
        for child in getattr(node, "_layers", []):
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            yield child
            yield from visit(child)

    yield from visit(layer)


def batchnorm_layers(
    model: keras.layers.Layer,
) -> list[keras.layers.BatchNormalization]:
    """Every BatchNormalization layer in `model`, nested ones included."""
    return [
        layer
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def set_batchnorm_momentum(model: keras.layers.Layer, momentum: float) -> int:
    """Sets `momentum` on every BN layer of `model`; returns how many.

    Call it before `compile`/`fit`: a traced train step keeps the momentum
    it was traced with.
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1). Received: momentum={momentum}")
    layers = batchnorm_layers(model)
    for layer in layers:
        layer.momentum = float(momentum)
    return len(layers)


def apply_batchnorm_policy(model: keras.layers.Layer, cfg: BatchNormConfig) -> int:
    """Applies the recipe's BN momentum override and, with `cfg.fused`,
    switches plain Keras BN layers to the fused kernel; returns the BN
    layer count.

    `cfg.trainable` is applied by `advtrain.models.freezing.apply_phase`,
    which decides what trains; recalibration and the gap report run after
    training.

    Example:

    ```python
    apply_batchnorm_policy(classifier, BatchNormConfig(momentum=0.9))
    classifier.compile(...)
    ```
    """
    if cfg.fused:
        from advtrain.models.fused_batchnorm import fuse_batchnorm

        fuse_batchnorm(model)
    if cfg.momentum is None:
        return len(batchnorm_layers(model))
    return set_batchnorm_momentum(model, cfg.momentum)


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

    Each batch is passed through the model in training mode with the
    recalibrated layers at momentum 0, so after the pass their moving
    statistics are that batch's statistics; the new moving mean and
    variance are the plain average of those over the batches (every batch
    weighs the same, unlike the exponential moving average of training).
    Everything else in the model is left as it was: weights, momentum,
    trainable flags, and the layers not recalibrated.

    Args:
        model: the classifier (or a model wrapping it).
        dataset: an iterable of batches, `x` or `(x, y, ...)`, such as the
            un-augmented training `tf.data.Dataset`; batches should have
            the training batch size, since the statistics are per batch.
        num_batches: how many batches to average (fewer if the data ends).
        include_frozen: also re-estimate BN layers that are frozen
            (`trainable=False`, inference mode). Off by default: a frozen
            pretrained backbone keeps the statistics its head was trained
            with.

    Returns:
        The number of batches averaged.

    Raises:
        ValueError: `num_batches < 1` or the dataset yields no batch.

    Example:

    ```python
    recalibrate_batchnorm(classifier, train_ds, num_batches=50)
    ```
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
    # A frozen BN layer only computes batch statistics once trainable;
    # setting it on the layer alone leaves its parents as they are.
    untouched = [
        (layer, layer.moving_mean.numpy(), layer.moving_variance.numpy())
        for layer in all_bn
        if layer not in layers
    ]
    sums = [
        [np.zeros(layer.moving_mean.shape, "float64") for _ in range(2)]
        for layer in layers
    ]
    count = 0
    try:
        for layer in layers:
            layer.momentum = 0.0
            layer.trainable = True
        for batch in dataset:
            if count >= num_batches:
                break
            model(_batch_inputs(batch), training=True)
            for layer, (mean_sum, var_sum) in zip(layers, sums, strict=True):
                mean_sum += layer.moving_mean.numpy()
                var_sum += layer.moving_variance.numpy()
            count += 1
    finally:
        for layer, momentum, trainable in saved:
            layer.momentum = momentum
            layer.trainable = trainable
        for layer, mean, variance in untouched:
            layer.moving_mean.assign(mean)
            layer.moving_variance.assign(variance)
    if count == 0:
        raise ValueError("recalibrate_batchnorm: the dataset yielded no batch.")
    for layer, (mean_sum, var_sum) in zip(layers, sums, strict=True):
        layer.moving_mean.assign((mean_sum / count).astype("float32"))
        layer.moving_variance.assign((var_sum / count).astype("float32"))
    return count


def _accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    y = np.asarray(y)
    if y.ndim == logits.ndim:  # one-hot
        y = y.argmax(axis=-1)
    return float(np.mean(logits.argmax(axis=-1) == y.reshape(-1)))


def bn_gap(
    model: keras.Model,
    x: Any,
    y: Any,
    batch_size: Optional[int] = None,
) -> dict[str, float]:
    """Accuracy with BN in training mode vs inference mode on one batch set.

    Training mode is what `fit` computes: trainable BN layers normalise with
    the batch's statistics (frozen ones use their moving statistics either
    way). Dropout is switched off for both passes, so the gap measures BN
    alone. No moving statistic changes: they are restored after the
    training-mode pass.

    Args:
        model: the classifier, returning logits (or probabilities).
        x: held-out images, [0, 1] pixels.
        y: integer labels or one-hot labels.
        batch_size: split `x` into batches of this size, as in training
            (train-mode statistics depend on the batch); None: one batch.

    Returns:
        dict(train_mode_accuracy, inference_mode_accuracy, gap), with
        gap = train_mode_accuracy - inference_mode_accuracy.

    Example:

    ```python
    report = bn_gap(classifier, x_val[:512], y_val[:512], batch_size=64)
    message = bn_gap_warning(report["gap"])
    ```
    """
    x = np.asarray(x)
    n = len(x)
    if n == 0:
        raise ValueError("bn_gap needs at least one example. Received: 0")
    step = batch_size or n
    bns = batchnorm_layers(model)
    saved_stats = [
        (layer, layer.moving_mean.numpy(), layer.moving_variance.numpy())
        for layer in bns
    ]
    dropouts = [
        (layer, layer.rate)
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.Dropout)
    ]
    outputs: dict[bool, list[np.ndarray]] = {True: [], False: []}
    try:
        for layer, _ in dropouts:
            layer.rate = 0.0
        for training in (True, False):
            for start in range(0, n, step):
                logits = model(x[start : start + step], training=training)
                outputs[training].append(keras.ops.convert_to_numpy(logits))
    finally:
        for layer, rate in dropouts:
            layer.rate = rate
        for layer, mean, variance in saved_stats:
            layer.moving_mean.assign(mean)
            layer.moving_variance.assign(variance)
    train_acc = _accuracy(np.concatenate(outputs[True]), y)
    infer_acc = _accuracy(np.concatenate(outputs[False]), y)
    return {
        "train_mode_accuracy": train_acc,
        "inference_mode_accuracy": infer_acc,
        "gap": train_acc - infer_acc,
    }


def bn_gap_warning(gap: float, threshold: float = 0.05) -> Optional[str]:
    """A one-line warning when the BN gap exceeds `threshold`, else None.

    Example:

    ```python
    bn_gap_warning(0.31)  # "BatchNorm gap: ... momentum: 0.9 ..."
    ```
    """
    if abs(gap) <= threshold:
        return None
    if gap > 0:
        cause = (
            "training-mode accuracy exceeds inference-mode accuracy by "
            f"{gap:.3f} (threshold {threshold:.3f}): the BN moving "
            "statistics lag the weights."
        )
    else:
        cause = (
            "inference-mode accuracy exceeds training-mode accuracy by "
            f"{-gap:.3f} (threshold {threshold:.3f}): batch statistics are "
            "noisy (small batches?)."
        )
    return (
        f"BatchNorm gap: {cause} Fix: set model.batchnorm.momentum: 0.9 "
        "for short runs, or model.batchnorm.recalibrate: true to "
        "re-estimate the statistics on clean training data after training."
    )
