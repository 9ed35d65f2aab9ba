"""FGSM: plain, from a uniform random start (FGSM-RS), N-FGSM, ZeroGrad."""

from __future__ import annotations

from typing import Any, Optional

from keras import ops

from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    Norm,
    attack_inputs,
    canonical_norm,
    check_eps,
    check_fraction,
    checked_norm,
    clip_pixels,
    input_gradient,
    per_example,
    project,
    random_in_ball,
    steepest_step,
)


def fgsm(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    norm: Norm = "inf",
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    return_gradient: bool = False,
) -> Any:
    """One steepest-ascent step of size `eps` (Goodfellow et al. 2015).

    With `norm="inf"` this is FGSM (`eps * sign(grad)`); with `norm=2` the
    fast gradient method with an L2-normalised gradient.

    Args:
        model_fn: maps pixels to logits, e.g. `lambda x: model(x)`.
        x: float pixels, typically in [0, 1].
        y: integer labels (or probability rows); None uses predictions.
        eps: perturbation size in pixel units.
        norm: "inf" or 2.
        loss_fn: `(labels, logits) -> per-example loss`; cross-entropy.
        clip_min: the lowest valid pixel value (None: no bound).
        clip_max: the highest valid pixel value (None: no bound).
        loss_scale: multiplies the loss before differentiating (mixed
            precision); the step only uses the gradient's direction.
        return_gradient: also return the input gradient the step used.

    Returns:
        Adversarial pixels with the dtype of `x` (and the gradient).

    Example:

    ```python
    x_adv = fgsm(lambda x: model(x, training=False), x, y, eps=8 / 255)
    ```
    """
    norm = checked_norm(norm, eps)
    x, y = attack_inputs(model_fn, x, y)
    grad = input_gradient(model_fn, x, y, loss_fn, loss_scale)
    x_adv = fgsm_from_gradient(
        x, grad, eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max
    )
    return (x_adv, grad) if return_gradient else x_adv


def fgsm_from_gradient(
    x: Any,
    grad: Any,
    *,
    eps: float,
    norm: Norm = "inf",
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
) -> Any:
    """FGSM's result for an input gradient `grad` computed elsewhere."""
    step = steepest_step(grad, eps, canonical_norm(norm))
    return clip_pixels(x + step, clip_min, clip_max)


def fgsm_random_start(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    alpha: Optional[float] = None,
    norm: Norm = "inf",
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
    return_gradient: bool = False,
    clip_start: bool = True,
) -> Any:
    """FGSM from a uniform random point in the eps-ball, step `alpha`.

    The "fast is better than free" variant (Wong, Rice and Kolter 2020): the
    random start and a step `alpha = 1.25 * eps` avoid the catastrophic
    overfitting of plain FGSM training. The result is projected back onto
    the eps-ball and the pixel range.

    `clip_start=False` takes the gradient at the random point as drawn,
    even outside the pixel range (the paper's MNIST code); the default
    clips it first, as cleverhans does, which on images with many
    saturated pixels (MNIST) makes the start much less random.

    Example:

    ```python
    x_adv = fgsm_random_start(model_fn, x, y, eps=0.3, alpha=0.375)
    ```
    """
    alpha = 1.25 * eps if alpha is None else alpha
    return _step_from_noise(
        model_fn,
        x,
        y,
        eps=eps,
        alpha=alpha,
        noise=eps,
        project_to_eps=True,
        norm=norm,
        loss_fn=loss_fn,
        clip_min=clip_min,
        clip_max=clip_max,
        loss_scale=loss_scale,
        seed=seed,
        return_gradient=return_gradient,
        clip_start=clip_start,
    )


def fgsm_random_start_from_gradient(
    x: Any,
    grad: Any,
    *,
    eps: float,
    alpha: Optional[float] = None,
    norm: Norm = "inf",
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    seed: Any = None,
    clip_start: bool = True,
) -> Any:
    """FGSM-RS's step along a gradient `grad` computed elsewhere, from the
    random start `fgsm_random_start` draws from the same `seed`."""
    norm = canonical_norm(norm)
    alpha = 1.25 * eps if alpha is None else alpha
    start = _random_start(x, eps, norm, seed, clip_start, clip_min, clip_max)
    return _step(x, start, grad, alpha, eps, norm, clip_min, clip_max)


def n_fgsm(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    alpha: Optional[float] = None,
    noise: Optional[float] = None,
    norm: Norm = "inf",
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
    return_gradient: bool = False,
    clip_start: bool = True,
) -> Any:
    """N-FGSM (de Jorge et al. 2022): FGSM from stronger noise, unprojected.

    The start is drawn uniformly from the `noise`-ball (default `2 * eps`)
    and the step `alpha` (default `eps`) is taken from there without
    projecting onto the eps-ball, so the perturbation can reach
    `noise + alpha` (only the pixel range clips it). The defaults suit
    CIFAR-10 at eps 8/255; at MNIST's eps 0.3 pass a smaller `noise`.

    Example:

    ```python
    x_adv = n_fgsm(model_fn, x, y, eps=8 / 255)  # noise 16/255, step 8/255
    ```
    """
    alpha = eps if alpha is None else alpha
    noise = 2 * eps if noise is None else noise
    return _step_from_noise(
        model_fn,
        x,
        y,
        eps=eps,
        alpha=alpha,
        noise=noise,
        project_to_eps=False,
        norm=norm,
        loss_fn=loss_fn,
        clip_min=clip_min,
        clip_max=clip_max,
        loss_scale=loss_scale,
        seed=seed,
        return_gradient=return_gradient,
        clip_start=clip_start,
    )


def zerograd(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    alpha: Optional[float] = None,
    zero_quantile: float = 0.35,
    norm: Norm = "inf",
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
    return_gradient: bool = False,
    clip_start: bool = True,
) -> Any:
    """ZeroGrad (Golgooni et al. 2021): FGSM-RS that ignores small gradients.

    As `fgsm_random_start`, except that in each example the input-gradient
    entries below that example's `zero_quantile` quantile of magnitude
    (default 0.35, the paper's CIFAR-10 value) are set to zero, so those
    pixels take no step. The returned gradient is the masked one.

    Example:

    ```python
    x_adv = zerograd(model_fn, x, y, eps=0.3, zero_quantile=0.35)
    ```
    """
    check_fraction("zero_quantile", zero_quantile)
    alpha = 1.25 * eps if alpha is None else alpha
    return _step_from_noise(
        model_fn,
        x,
        y,
        eps=eps,
        alpha=alpha,
        noise=eps,
        project_to_eps=True,
        norm=norm,
        loss_fn=loss_fn,
        clip_min=clip_min,
        clip_max=clip_max,
        loss_scale=loss_scale,
        seed=seed,
        return_gradient=return_gradient,
        clip_start=clip_start,
        zero_quantile=zero_quantile,
    )


def _step_from_noise(
    model_fn,
    x,
    y,
    *,
    eps,
    alpha,
    noise,
    project_to_eps,
    norm,
    loss_fn,
    clip_min,
    clip_max,
    loss_scale,
    seed,
    return_gradient,
    clip_start,
    zero_quantile=0.0,
):
    norm = checked_norm(norm, eps)
    check_eps("alpha", alpha)
    check_eps("noise", noise)
    x, y = attack_inputs(model_fn, x, y)
    start = _random_start(x, noise, norm, seed, clip_start, clip_min, clip_max)
    grad = input_gradient(model_fn, start, y, loss_fn, loss_scale)
    grad = _zero_small(grad, zero_quantile)
    projected_to = eps if project_to_eps else None
    x_adv = _step(x, start, grad, alpha, projected_to, norm, clip_min, clip_max)
    return (x_adv, grad) if return_gradient else x_adv


def _random_start(x, noise, norm, seed, clip_start, clip_min, clip_max):
    start = x + random_in_ball(x, noise, norm, seed)
    return clip_pixels(start, clip_min, clip_max) if clip_start else start


def _step(x, start, grad, alpha, eps, norm, clip_min, clip_max):
    # From `start` along `grad`, onto the eps-ball (None: not projected).
    delta = start + steepest_step(grad, alpha, norm) - x
    if eps is not None:
        delta = project(delta, eps, norm)
    return clip_pixels(x + delta, clip_min, clip_max)


def _zero_small(grad: Any, quantile: float) -> Any:
    # Each example's entries below its `quantile` of |grad| set to zero
    # (the quantile interpolated linearly, numpy's default).
    if quantile == 0.0:
        return grad
    ordered = ops.sort(ops.reshape(ops.abs(grad), (ops.shape(grad)[0], -1)), axis=1)
    size = ops.shape(ordered)[1]
    position = quantile * ops.cast(size - 1, "float32")
    low = ops.cast(ops.floor(position), "int32")
    high = ops.minimum(low + 1, size - 1)
    share = ops.cast(position - ops.cast(low, "float32"), grad.dtype)
    below, above = ops.take(ordered, low, axis=1), ops.take(ordered, high, axis=1)
    threshold = per_example(below + share * (above - below), ops.ndim(grad))
    return ops.where(ops.abs(grad) < threshold, ops.zeros_like(grad), grad)
