"""Projected Gradient Descent (Madry et al. 2018), L-inf and L2."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    Norm,
    attack_inputs,
    check_eps,
    checked_norm,
    clip_pixels,
    input_gradient,
    per_example_cross_entropy,
    project,
    random_in_ball,
    steepest_step,
)


def pgd(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    steps: int = 10,
    step_size: Optional[float] = None,
    norm: Norm = "inf",
    random_start: bool = True,
    restarts: int = 1,
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
) -> tf.Tensor:
    """Iterated steepest-ascent steps, each projected onto the eps-ball.

    With `restarts > 1` the attack is run from several random starts and the
    worst case is kept per example: a misclassified result beats a correct
    one, and among equals the higher loss wins. So more restarts can only
    lower the accuracy under attack.

    Args:
        model_fn: maps pixels to logits.
        x: float pixels.
        y: integer labels (or probability rows); None uses predictions.
        eps: radius of the ball in pixel units.
        steps: iterations per restart.
        step_size: per-iteration step; defaults to `2.5 * eps / steps`.
        norm: "inf" or 2.
        random_start: start uniformly inside the ball (else at `x`).
        restarts: independent runs; the worst case per example is kept.
        loss_fn: `(labels, logits) -> per-example loss`.
        clip_min, clip_max: valid pixel range.
        loss_scale: multiplies the loss before differentiating.
        seed: None, an int or a `keras.random.SeedGenerator`.

    Example:

    ```python
    x_adv = pgd(model_fn, x, y, eps=0.1, steps=20, restarts=5)
    ```
    """
    norm = checked_norm(norm, eps)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1. Received: steps={steps!r}")
    if not isinstance(restarts, int) or restarts < 1:
        raise ValueError(
            f"restarts must be an int >= 1. Received: restarts={restarts!r}"
        )
    step_size = 2.5 * eps / steps if step_size is None else step_size
    check_eps("step_size", step_size)
    x, y = attack_inputs(model_fn, x, y)
    loss_fn = loss_fn or per_example_cross_entropy

    def one_run():
        if random_start:
            start = x + random_in_ball(x, eps, norm, seed)
        else:
            start = x
        start = clip_pixels(start, clip_min, clip_max)

        def body(i, x_adv):
            grad = input_gradient(model_fn, x_adv, y, loss_fn, loss_scale)
            # Clip, project, clip again: the order cleverhans uses, so
            # the two backends agree for L2 too.
            moved = clip_pixels(
                x_adv + steepest_step(grad, step_size, norm), clip_min, clip_max
            )
            delta = project(moved - x, eps, norm)
            return i + 1, clip_pixels(x + delta, clip_min, clip_max)

        _, x_adv = tf.while_loop(
            lambda i, _: i < steps,
            body,
            (tf.constant(0), start),
            maximum_iterations=steps,
        )
        return tf.stop_gradient(x_adv)

    best = one_run()
    if restarts == 1:
        return best
    best_wrong, best_loss = _outcome(model_fn, best, y, loss_fn)
    for _ in range(restarts - 1):
        candidate = one_run()
        wrong, loss = _outcome(model_fn, candidate, y, loss_fn)
        # Misclassified beats correct; among equals the higher loss wins.
        better = (wrong & ~best_wrong) | (
            tf.equal(wrong, best_wrong) & (loss > best_loss)
        )
        mask = tf.reshape(better, [-1] + [1] * (x.shape.rank - 1))
        best = tf.where(mask, candidate, best)
        best_wrong = best_wrong | wrong
        best_loss = tf.where(better, loss, best_loss)
    return best


def _outcome(model_fn, x_adv, y, loss_fn) -> tuple[tf.Tensor, tf.Tensor]:
    """Per example: is it misclassified, and its loss."""
    logits = model_fn(x_adv)
    loss = tf.cast(loss_fn(y, logits), tf.float32)
    if y.shape.rank == logits.shape.rank:
        labels = tf.argmax(y, axis=-1)
    else:
        labels = tf.reshape(y, [-1])
    wrong = tf.not_equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64))
    return wrong, loss
