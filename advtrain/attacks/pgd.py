"""Projected Gradient Descent, L-inf and L2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from keras import ops

from advtrain import backend
from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    Norm,
    attack_inputs,
    check_count,
    check_eps,
    checked_norm,
    clip_pixels,
    fold_seed,
    input_gradient,
    int_labels,
    per_example_cross_entropy,
    predicted,
    project,
    random_in_ball,
    seed_pair,
    steepest_step,
    worse_of,
)


def pgd(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    steps: Any = 10,
    step_size: Optional[float] = None,
    norm: Norm = "inf",
    random_start: bool = True,
    restarts: Any = 1,
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
) -> Any:
    """Iterated steepest-ascent steps, each projected onto the eps-ball
    (Madry et al. 2018). With `restarts > 1`, the worst case per example
    over several random starts: misclassified beats correct, then the
    higher loss wins, so more restarts can only lower the accuracy.

    Args:
        model_fn: maps pixels to logits.
        x: float pixels.
        y: integer labels (or probability rows); None uses predictions.
        eps: radius of the ball in pixel units.
        steps: iterations per restart: an int or a scalar integer tensor.
        step_size: per-iteration step; defaults to `2.5 * eps / steps`.
        norm: "inf" or 2.
        random_start: start uniformly inside the ball (else at `x`).
        restarts: independent runs, as `steps` an int or a tensor.
        loss_fn: `(labels, logits) -> per-example loss`.
        clip_min: the lowest valid pixel value.
        clip_max: the highest valid pixel value.
        loss_scale: multiplies the loss before differentiating.
        seed: None, an int or a `keras.random.SeedGenerator`.

    Example:

    ```python
    x_adv = pgd(model_fn, x, y, eps=0.1, steps=20, restarts=5)
    ```
    """
    norm = checked_norm(norm, eps)
    check_count("steps", steps)
    check_count("restarts", restarts)
    if step_size is None:
        step_size = default_step_size(eps, steps)
    check_eps("step_size", step_size)
    x, y = attack_inputs(model_fn, x, y)
    loss_fn = loss_fn or per_example_cross_entropy
    box = dict(eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max)

    def start(run_seed):
        return pgd_start(x, random_start=random_start, seed=run_seed, **box)

    def advance(x_adv):
        return pgd_steps(
            model_fn,
            x,
            y,
            x_adv,
            steps=steps,
            step_size=step_size,
            loss_fn=loss_fn,
            loss_scale=loss_scale,
            **box,
        )

    def judge(x_adv):
        return outcome(model_fn, x_adv, y, loss_fn)

    return worst_of_restarts(
        start, advance, judge, restarts=restarts, seed=seed, random_start=random_start
    )


def worst_of_restarts(
    start: Callable[[Any], Any],
    advance: Callable[[Any], Any],
    judge: Callable[[Any], tuple[Any, Any]],
    *,
    restarts: Any,
    seed: Any,
    random_start: bool,
) -> Any:
    """PGD's runs and their worst case per example (`worse_of`).

    Run 0 starts at `start(seed)`; run i > 0 at `start(fold_seed(pair, i))`,
    `pair` drawn from `seed` after run 0's start (a loop cannot advance a
    `SeedGenerator`). `advance(x_adv)` takes a run's steps, `judge(x_adv)`
    gives `(misclassified, loss)`. `pgd` passes ops traced into one graph;
    an evaluation on a `HOST_LOOPS` backend passes compiled pieces and an
    int `restarts`, and `backend.counted_loop` runs them from the host: one
    PGD, one seeding, either way.
    """
    best = advance(start(seed))
    if isinstance(restarts, int) and restarts == 1:
        return best
    pair = seed_pair(seed) if random_start else None

    def restart(i, *best):
        x_adv = advance(start(None if pair is None else fold_seed(pair, i)))
        return (i + 1, *worse_of(best, (x_adv, *judge(x_adv))))

    state = (ops.convert_to_tensor(1, "int32"), best, *judge(best))
    _, best, _, _ = backend.counted_loop(restart, state, restarts - 1)
    return best


def pgd_start(x, *, eps, norm, random_start, clip_min, clip_max, seed) -> Any:
    """PGD's starting point: uniform in the eps-ball with `random_start`."""
    start = x + random_in_ball(x, eps, norm, seed) if random_start else x
    return clip_pixels(start, clip_min, clip_max)


def pgd_steps(
    model_fn,
    x,
    y,
    x_adv,
    *,
    steps,
    eps,
    norm,
    step_size,
    loss_fn,
    loss_scale,
    clip_min,
    clip_max,
) -> Any:
    """`steps` projected steepest-ascent steps from `x_adv` around `x`."""

    def body(i, x_adv):
        grad = input_gradient(model_fn, x_adv, y, loss_fn, loss_scale)
        # Clip, project, clip again: cleverhans's order, so the two agree.
        step = steepest_step(grad, step_size, norm)
        delta = project(clip_pixels(x_adv + step, clip_min, clip_max) - x, eps, norm)
        return i + 1, clip_pixels(x + delta, clip_min, clip_max)

    _, x_adv = backend.counted_loop(
        body, (ops.convert_to_tensor(0, "int32"), x_adv), steps
    )
    return ops.stop_gradient(x_adv)


def default_step_size(eps: Any, steps: Any) -> Any:
    """PGD's step when none is given: `2.5 * eps / steps` (Madry et al.)."""
    if not isinstance(steps, int):
        steps = ops.cast(steps, getattr(eps, "dtype", "float32"))
    return 2.5 * eps / steps


def outcome(model_fn, x_adv, y, loss_fn=None) -> tuple[Any, Any]:
    """Per example: is it misclassified, and its (float32) loss."""
    loss_fn = loss_fn or per_example_cross_entropy
    logits = model_fn(x_adv)
    loss = ops.cast(loss_fn(y, logits), "float32")
    return predicted(logits) != int_labels(y), loss
