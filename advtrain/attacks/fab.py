"""FAB-T (Croce and Hein 2020): the targeted Fast Adaptive Boundary attack,
the third member of AutoAttack's standard set.

Each step linearises the boundary between the true and a target class,
projects the current point and the input onto it (minimal L-inf move
inside the pixel box) and moves to a blend of the two leaning towards the
input. An example is broken when the closest adversarial point found lies
within eps. Settings follow fra31/auto-attack's standard version.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import keras
from keras import ops

from advtrain import backend
from advtrain.attacks.common import (
    ModelFn,
    Norm,
    Pieces,
    attack_inputs,
    check_count,
    checked_norm,
    int_labels,
    is_number,
    per_example,
    predicted,
    runs_until_fooled,
)
from advtrain.utils.errors import ArgumentError

DEFAULT_TARGETS = 9  # AutoAttack's FAB-T: the 9 most likely wrong classes
_TINY = 1e-12
_MIN_STEP = 1e-8  # the reference's floor on the projections' lengths


def fab_t(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    norm: Norm = "inf",
    steps: int = 100,
    targets: int = DEFAULT_TARGETS,
    restarts: int = 1,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    clip_min: float = 0.0,
    clip_max: float = 1.0,
    seed: Any = None,
) -> Any:
    """Targeted FAB, L-inf only (AutoAttack's FAB-T).

    Tries the `targets` classes (at most classes - 1) the model ranks
    highest after the true one on the clean input, `steps` iterations and
    `restarts` runs each (runs after the first start at a random point at
    L-inf distance eps / 2, drawn from `seed`). `alpha_max` caps the
    weight of the input's projection in each step's blend; `eta` is each
    projection's overshoot; from an adversarial point the next is
    `x + beta * delta`. `clip_min`, `clip_max` must be finite. Returns
    per example the closest adversarial point found within eps, else `x`
    unchanged (also for an example misclassified already).

    Example:

    ```python
    x_adv = fab_t(lambda x: model(x, training=False), x, y, eps=0.3)
    ```
    """
    _validate(eps, norm, steps, targets, restarts, alpha_max, eta, beta)
    finite = all(is_number(v) and math.isfinite(v) for v in (clip_min, clip_max))
    if not finite or not clip_min < clip_max:
        raise ArgumentError(
            "clip_max",
            "fab_t projects inside the pixel box: clip_min and clip_max must be "
            f"finite numbers, clip_min < clip_max. Received: clip_min={clip_min!r}"
            f", clip_max={clip_max!r}",
        )
    pieces = Pieces.of(model_fn, x)
    x, y = attack_inputs(pieces, x, y)
    dtype = x.dtype
    x = ops.cast(x, "float32")
    labels = int_labels(y)
    clean_logits = ops.cast(pieces(x), "float32")
    classes = clean_logits.shape[-1]
    if classes is not None and classes < 2:
        raise ValueError(f"FAB-T needs at least 2 classes. Received: classes={classes}")
    if classes is not None:
        targets = min(targets, classes - 1)
    # Target k is the (k + 2)-th most likely class on the clean input, as in
    # AutoAttack (for a correctly classified input: the k-th wrong class).
    ranked = ops.cast(ops.argsort(-clean_logits, axis=-1), "int32")
    wrong = ops.not_equal(predicted(clean_logits), labels)
    box = (float(clip_min), float(clip_max))
    starts = _random_starts(x, eps, restarts, box, seed)
    eps = ops.cast(eps, "float32")
    options = dict(steps=steps, alpha_max=alpha_max, eta=eta, beta=beta, box=box)
    runs = targets * restarts

    def body(run, best, done):
        target = ops.take(ranked, run // restarts + 1, axis=1)
        start = x if starts is None else _start_of(x, starts, run % restarts)
        point, distance = _fab_run(pieces, x, start, labels, target, **options)
        new = ops.logical_and(ops.less_equal(distance, eps), ops.logical_not(done))
        best = ops.where(per_example(new, ops.ndim(x)), point, best)
        return run + 1, best, ops.logical_or(done, new)

    start = (ops.convert_to_tensor(0, "int32"), x, wrong)
    _, best, _ = runs_until_fooled(pieces, body, start, runs)
    return ops.cast(ops.stop_gradient(best), dtype)


def _validate(eps, norm, steps, targets, restarts, alpha_max, eta, beta) -> None:
    if checked_norm(norm, eps) != "inf":
        raise ArgumentError(
            "norm", f"fab_t supports norm='inf' only. Received: norm={norm!r}"
        )
    check_count("steps", steps, tensor=False)
    check_count("restarts", restarts, tensor=False)
    check_count("targets", targets, tensor=False)
    if not 0.0 <= alpha_max <= 1.0:
        raise ArgumentError(
            "alpha_max", f"must be in [0, 1]. Received: alpha_max={alpha_max!r}"
        )
    if not eta >= 1.0:
        raise ArgumentError("eta", f"must be >= 1. Received: eta={eta!r}")
    if not 0.0 < beta <= 1.0:
        raise ArgumentError("beta", f"must be in (0, 1]. Received: beta={beta!r}")


def _random_starts(x, eps, restarts: int, box, seed):
    # Runs 1.. of each target: uniform noise rescaled to L-inf length eps / 2.
    if restarts == 1:
        return None
    shape = (restarts - 1, *ops.shape(x))
    noise = keras.random.uniform(shape, minval=-1.0, maxval=1.0, seed=seed)
    axes = tuple(range(2, len(x.shape) + 1))
    noise = noise / (ops.max(ops.abs(noise), axis=axes, keepdims=True) + _TINY)
    return ops.clip(x[None] + 0.5 * ops.cast(eps, "float32") * noise, *box)


def _start_of(x, starts, restart):
    index = ops.maximum(restart - 1, 0)
    drawn = ops.take(starts, index, axis=0)
    return ops.where(ops.equal(restart, 0), x, drawn)


def _margin(pair, logits):
    # Target logit minus true logit; `pair`: (true, target) per example.
    logits = ops.cast(logits, "float32")
    chosen = ops.take_along_axis(logits, pair, axis=1)
    return chosen[:, 1] - chosen[:, 0]


def _fab_run(pieces, x0, start, labels, target, *, steps, **options):
    # Per example the closest adversarial point found and its L-inf distance
    # from `x0` (inf if none): `steps` iterations, in one loop or in chunks.
    state = (start, x0, ops.full((ops.shape(x0)[0],), math.inf, "float32"))
    for _, count in pieces.spans(steps):
        state = pieces.run(
            _fab_steps, x0, labels, target, state, count=count, **options
        )
    _, best, distance = state
    return best, distance


def _fab_steps(
    model_fn, x0, labels, target, state, *, count, alpha_max, eta, beta, box
):
    # `count` FAB iterations from `state`: (current point, best, distance).
    batch = ops.shape(x0)[0]
    flat = (batch, -1)
    pair = ops.stack([labels, target], axis=1)

    def margins(z):
        each = _margin(pair, model_fn(z))
        return ops.sum(each), each

    def body(x1, best, distance):
        # One forward pass gives the margin and its gradient.
        (_, margin), grad = backend.value_and_grad(margins, x1)
        w = ops.reshape(backend.finite_or_zero(grad), flat)
        # The linearised boundary between true and target class: w.z = b.
        b = ops.sum(w * ops.reshape(x1, flat), axis=1) - margin
        moves = project_linf(
            ops.concatenate([ops.reshape(x1, flat), ops.reshape(x0, flat)], 0),
            ops.concatenate([w, w], 0),
            ops.concatenate([b, b], 0),
            *box,
        )
        d1 = ops.reshape(moves[:batch], ops.shape(x0))
        d2 = ops.reshape(moves[batch:], ops.shape(x0))
        length = ops.maximum(ops.max(ops.abs(moves), axis=1), _MIN_STEP)
        a1, a2 = length[:batch], length[batch:]
        alpha = ops.clip(a1 / (a1 + a2), 0.0, alpha_max)
        alpha = per_example(alpha, ops.ndim(x0))
        x1 = (x1 + eta * d1) * (1 - alpha) + (x0 + eta * d2) * alpha
        x1 = ops.clip(x1, *box)
        fooled = ops.not_equal(predicted(model_fn(x1)), labels)
        size = ops.max(ops.abs(ops.reshape(x1 - x0, flat)), axis=1)
        closer = ops.logical_and(fooled, ops.less(size, distance))
        best = ops.where(per_example(closer, ops.ndim(x0)), x1, best)
        distance = ops.where(closer, size, distance)
        # Back towards the input from an adversarial point (FAB's beta step).
        x1 = ops.where(per_example(fooled, ops.ndim(x0)), x0 + (x1 - x0) * beta, x1)
        return x1, best, distance

    return backend.counted_loop(body, state, count)


def project_linf(t, w, b, low: float, high: float):
    """Per row, the smallest L-inf move `d` with `w.(t + d) = b` and
    `low <= t + d <= high`; where the box does not reach the hyperplane,
    the move to the box corner nearest it.

    Rows are flattened points `t` (N, D), normals `w` (N, D), offsets `b`
    (N,). With the sign of `w` chosen so that the plane lies in the
    direction of decreasing `w.z`, coordinate i moves towards the box
    side that lowers `w.z`, by `min(lam, room_i)` for a common length
    `lam`. `w.d` is then piecewise linear and decreasing in `lam`, with
    kinks at the rooms; sorting the rooms finds the piece where it meets
    the plane, and `lam` solves that piece's linear equation.
    """
    t, w, b = (ops.convert_to_tensor(a) for a in (t, w, b))
    gap = b - ops.sum(w * t, axis=1)
    side = ops.where(ops.greater(gap, 0.0), -1.0, 1.0)
    w, gap = w * side[:, None], gap * side  # now gap <= 0: lower w.z by -gap
    up = ops.less(w, 0.0)
    room = ops.where(up, high - t, t - low)
    weight = ops.abs(w)
    order = ops.argsort(-room, axis=1)
    room_sorted = ops.take_along_axis(room, order, axis=1)
    weight_sorted = ops.take_along_axis(weight, order, axis=1)
    # Moving the k+1 roomiest coordinates by lam = room_sorted[k] and the
    # others all the way, w.d = -(capped[k] * lam + rest[k]).
    capped = ops.cumsum(weight_sorted, axis=1)
    spent = weight_sorted * room_sorted
    rest = ops.sum(spent, axis=1, keepdims=True) - ops.cumsum(spent, axis=1)
    reach = -(capped * room_sorted + rest)  # increasing along the row
    # The last kink short of the plane: lam lies between it and the next.
    short = ops.sum(ops.cast(ops.greater(gap[:, None], reach), "int32"), axis=1)
    k = ops.maximum(short - 1, 0)[:, None]
    rest_k = ops.take_along_axis(rest, k, axis=1)[:, 0]
    capped_k = ops.take_along_axis(capped, k, axis=1)[:, 0]
    lam = ops.maximum(-(gap + rest_k) / ops.maximum(capped_k, _TINY), 0.0)
    # No kink short of the plane: even the whole box cannot reach it.
    lam = ops.where(ops.greater(short, 0), lam, ops.max(room, axis=1))
    size = ops.minimum(lam[:, None], room)
    return ops.where(up, size, -size) * ops.cast(ops.not_equal(w, 0.0), w.dtype)
