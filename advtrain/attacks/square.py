"""Square Attack (Andriushchenko, Croce, Flammarion and Hein, ECCV 2020).

A score-based, gradient-free attack: it only reads the logits, so gradient
masking cannot hide a model's weakness from it. Each query changes the
perturbation inside one random square window and keeps the change when it
lowers the margin `z_y - max_{j != y} z_j`; an image is done once its margin
is negative (misclassified). The window's side follows the paper's schedule:
a share `p` of the image, halved at fixed query counts (10, 50, 200, 500,
1,000, 2,000, 4,000, 6,000, 8,000 on the 10,000-query scale).

L-inf: the start is vertical stripes of +-eps; a query sets the window to
+-eps per channel. L2: the start is a grid of the paper's centred
"pseudo-Gaussian" blocks scaled to norm eps; a query moves perturbation
mass from a second window into the first, keeping the norm at eps.

Everything runs in-graph on the whole batch: every image draws its own
window position and signs, keeps its own query counter and stops
querying once fooled (the model only sees the images still standing).
Settings follow the paper and AutoAttack's Square (p_init 0.8, margin
loss, the unscaled schedule); where they differ from AutoAttack's code,
`square` says so.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from advtrain.attacks.common import (
    ModelFn,
    Norm,
    attack_inputs,
    check_count,
    checked_norm,
    clip_pixels,
    int_labels,
)

# The query counts (on a 10,000-query scale) after which the window's
# share of the image halves.
_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
_TINY = 1e-12


def square(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    norm: Norm = "inf",
    queries: int = 5000,
    restarts: int = 1,
    p_init: float = 0.8,
    rescale_schedule: bool = False,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    seed: Any = None,
    return_queries: bool = False,
) -> Any:
    """Square Attack on a batch of images (channels last).

    Args:
        model_fn: maps pixels to logits.
        x: float pixels, shape `(batch, height, width, channels)`.
        y: integer labels (or probability rows); None uses predictions.
        eps: radius of the ball in pixel units.
        norm: "inf" or 2.
        queries: model queries per image and restart, the first (the
            random start) included; AutoAttack: 5,000.
        restarts: runs from fresh starts for the images still standing.
        p_init: the window's initial share of the image (AutoAttack: 0.8).
        rescale_schedule: spread the halvings over `queries` instead of
            10,000 queries (AutoAttack's ensemble does not rescale).
        clip_min, clip_max: valid pixel range.
        seed: None, an int or a `keras.random.SeedGenerator`.
        return_queries: also return the queries each image used.

    Returns:
        Per example, a misclassified point if one was found, else the point
        of smallest margin; the dtype of `x`. With `return_queries`, the
        pair `(x_adv, queries_used)` (int32 per example).

    Example:

    ```python
    x_adv = square(lambda x: model(x, training=False), x, y, eps=0.3)
    ```
    """
    norm = checked_norm(norm, eps)
    _check_settings(queries, restarts, p_init)
    x, y = attack_inputs(model_fn, x, y)
    if x.shape.rank != 4:
        raise ValueError(
            "square attacks images of shape (batch, height, width, channels). "
            f"Received: shape={tuple(x.shape)}"
        )
    height, width, channels = (int(d) for d in x.shape[1:])
    labels = int_labels(y)
    iterations = queries - 1  # the random start is the first query
    sides = _window_sides(iterations, p_init, height, width, norm, rescale_schedule)
    # Two int32 words seed every stateless draw below (one per restart and
    # query), so the whole attack follows from `seed`.
    base = tf.cast(keras.random.randint([2], 0, 2**31 - 1, seed=seed), tf.int32)
    run = _linf_run if norm == "inf" else _l2_run
    geometry = (height, width, channels)
    best = x
    margin = tf.fill([tf.shape(x)[0]], tf.constant(math.inf, tf.float32))
    used = tf.zeros([tf.shape(x)[0]], tf.int32)
    for r in range(restarts):
        seeds = base + tf.constant([0, 1_000_003], tf.int32) * r
        point, run_margin, run_used = run(
            model_fn, x, labels, margin, sides, iterations, geometry, seeds,
            eps=eps, clip_min=clip_min, clip_max=clip_max,
        )  # fmt: skip
        better = run_margin < margin
        best = tf.where(better[:, None, None, None], point, best)
        margin = tf.where(better, run_margin, margin)
        used += run_used
    best = tf.stop_gradient(best)
    return (best, used) if return_queries else best


def _check_settings(queries, restarts, p_init) -> None:
    check_count("queries", queries, tensor=False)
    check_count("restarts", restarts, tensor=False)
    if not 0.0 < p_init <= 1.0:
        raise ValueError(f"p_init must be in (0, 1]. Received: p_init={p_init!r}")


def share_at(query: int, p_init: float, total: int, rescale: bool) -> float:
    """The window's share of the image at iteration `query` (0-based,
    the random start not counted): the paper's piecewise schedule."""
    step = int(query / total * 10000) if rescale else query
    halvings = sum(step > mark for mark in _HALVINGS)
    return p_init / 2**halvings


def _window_sides(iterations, p_init, height, width, norm, rescale) -> list[int]:
    """The window's side at each iteration (at least one entry)."""
    smallest = 1 if norm == "inf" else 3
    sides = []
    for i in range(max(iterations, 1)):
        share = share_at(i, p_init, max(iterations, 1), rescale)
        side = max(int(round(math.sqrt(share * height * width))), smallest)
        if norm == "2" and side % 2 == 0:
            side += 1
        sides.append(min(side, height, width))
    return sides


def margin_of(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """`z_y - max_{j != y} z_j` per example (negative: misclassified)."""
    logits = tf.cast(logits, tf.float32)
    true = tf.gather(logits, labels, batch_dims=1)
    others = tf.where(
        tf.one_hot(labels, tf.shape(logits)[-1], on_value=True, off_value=False),
        tf.constant(-math.inf, tf.float32),
        logits,
    )
    return true - tf.reduce_max(others, axis=-1)


def _window(seeds, count, side, height, width):
    """Per image, a random `side` x `side` window inside the image: a mask
    of shape (count, height, width, 1) and the top-left corners."""
    top = tf.random.stateless_uniform(
        tf.stack([count, 1]), seed=seeds, minval=0, maxval=height - side + 1,
        dtype=tf.int32,
    )  # fmt: skip
    left = tf.random.stateless_uniform(
        tf.stack([count, 1]), seed=seeds + tf.constant([0, 1]), minval=0,
        maxval=width - side + 1, dtype=tf.int32,
    )  # fmt: skip
    in_rows = _inside(tf.range(height)[None, :], top, side)
    in_cols = _inside(tf.range(width)[None, :], left, side)
    mask = in_rows[:, :, None, None] & in_cols[:, None, :, None]
    return mask, top, left


def _inside(position, first, side):
    return (position >= first) & (position < first + side)


def _signs(seeds, shape, dtype):
    """+-1 with equal odds."""
    draw = tf.random.stateless_uniform(shape, seed=seeds)
    return tf.cast(tf.where(draw < 0.5, -1.0, 1.0), dtype)


def _step_seeds(seeds, i, salt: int):
    """A distinct stateless seed per iteration `i` and use `salt`."""
    return seeds + tf.stack([i + 1, tf.constant(salt * 7_919, tf.int32)])


def _search(model_fn, x, labels, done_margin, start, propose, iterations):
    """The query loop both norms share.

    `propose(i, x_standing, best_standing)` returns new candidates for the
    images still standing; a candidate replaces an image's best point when
    it lowers the margin. Images with a margin <= 0 (including those fooled
    by an earlier restart: `done_margin`) stop querying.
    """
    rank_pad = [-1, 1, 1, 1]
    margin = margin_of(model_fn(start), labels)
    # Images an earlier restart fooled stay out of this run.
    margin = tf.where(done_margin <= 0, done_margin, margin)
    used = tf.where(done_margin <= 0, 0, 1)

    def body(i, best, margin, used):
        standing = tf.where(margin > 0)[:, 0]
        x_now = tf.gather(x, standing)
        best_now = tf.gather(best, standing)
        candidate = propose(i, x_now, best_now)
        new_margin = margin_of(model_fn(candidate), tf.gather(labels, standing))
        improved = new_margin < tf.gather(margin, standing)
        index = standing[:, None]
        best = tf.tensor_scatter_nd_update(
            best,
            index,
            tf.where(tf.reshape(improved, rank_pad), candidate, best_now),
        )
        margin = tf.tensor_scatter_nd_update(
            margin, index, tf.minimum(new_margin, tf.gather(margin, standing))
        )
        used = tf.tensor_scatter_nd_add(used, index, tf.ones_like(standing, tf.int32))
        return i + 1, best, margin, used

    _, best, margin, used = tf.while_loop(
        lambda i, best, margin, used: (i < iterations) & tf.reduce_any(margin > 0),
        body,
        (tf.constant(0), start, margin, used),
        maximum_iterations=iterations,
    )
    return best, margin, used


def _linf_run(
    model_fn, x, labels, done_margin, sides, iterations, geometry, seeds, *,
    eps, clip_min, clip_max,
):  # fmt: skip
    """One L-inf run: vertical stripes of +-eps, then each query sets one
    window to +-eps per channel (AutoAttack adds +-2 eps and projects,
    which lands on the same points)."""
    height, width, channels = geometry
    eps_t = tf.cast(eps, x.dtype)
    stripes = _signs(seeds, tf.stack([tf.shape(x)[0], 1, width, channels]), x.dtype)
    start = clip_pixels(x + eps_t * stripes, clip_min, clip_max)
    side_at = tf.constant(sides, tf.int32)

    def propose(i, x_now, best_now):
        count = tf.shape(x_now)[0]
        mask, _, _ = _window(_step_seeds(seeds, i, 1), count, side_at[i], height, width)
        signs = _signs(
            _step_seeds(seeds, i, 2), tf.stack([count, 1, 1, channels]), x.dtype
        )
        candidate = tf.where(mask, x_now + eps_t * signs, best_now)
        return clip_pixels(candidate, clip_min, clip_max)

    return _search(model_fn, x, labels, done_margin, start, propose, iterations)


def _eta_rectangles(rows: int, cols: int) -> np.ndarray:
    """Nested rectangles around the centre, weight 1 / (k + 1)^2 for the
    k-th, unit L2 norm (the paper's building block)."""
    delta = np.zeros((rows, cols))
    if rows == 0 or cols == 0:
        return delta
    r, c = rows // 2, cols // 2
    for k in range(max(r, c) + 1):
        delta[max(r - k, 0) : r + k + 1, max(c - k, 0) : c + k + 1] += (
            1.0 / (k + 1) ** 2
        )
    return delta / np.sqrt(np.sum(delta**2))


def _eta(side: int) -> np.ndarray:
    """The paper's L2 window pattern: a positive block of rectangles over a
    negative one, unit L2 norm."""
    top = _eta_rectangles(side // 2, side)
    bottom = -_eta_rectangles(side - side // 2, side)
    delta = np.concatenate([top, bottom], axis=0)
    return delta / np.sqrt(np.sum(delta**2))


def _padded_patterns(sides: list[int]) -> tuple[np.ndarray, list[int]]:
    """`_eta` of each distinct side, zero-padded to the largest, as an array
    (pattern, orientation, row, col); and per iteration its pattern."""
    distinct = sorted(set(sides))
    size = max(distinct)
    patterns = np.zeros((len(distinct), 2, size, size), np.float32)
    for k, side in enumerate(distinct):
        eta = _eta(side)
        patterns[k, 0, :side, :side] = eta
        patterns[k, 1, :side, :side] = eta.T
    return patterns, [distinct.index(s) for s in sides]


def _l2_start(x, seeds, height, width, channels, eps, clip_min, clip_max):
    """AutoAttack's L2 start: a grid of `_eta` blocks of side height // 5,
    each with a random sign per channel and a random orientation, scaled to
    norm eps."""
    side = max(height // 5, 1)
    offset = (height - 5 * side) // 2
    block = np.full((height, width), -1, np.int32)
    canvas = np.zeros((2, height, width), np.float32)
    eta = _eta(side)
    index = 0
    for r in range(offset, offset + side * (height // side), side):
        for c in range(offset, offset + side * (width // side), side):
            if r + side > height or c + side > width:
                continue
            block[r : r + side, c : c + side] = index
            canvas[0, r : r + side, c : c + side] = eta
            canvas[1, r : r + side, c : c + side] = eta.T
            index += 1
    count = tf.shape(x)[0]
    signs = _signs(seeds, tf.stack([count, index + 1, channels]), x.dtype)
    turned = _signs(_step_seeds(seeds, -1, 3), tf.stack([count, index + 1]), x.dtype)
    where = tf.constant(np.maximum(block, 0))
    inside = tf.constant((block >= 0)[None, :, :, None])
    pattern = tf.where(
        tf.gather(turned, where, axis=1)[..., None] > 0,
        tf.constant(canvas[0][None, :, :, None], x.dtype),
        tf.constant(canvas[1][None, :, :, None], x.dtype),
    )
    delta = tf.where(inside, pattern * tf.gather(signs, where, axis=1), 0.0)
    return clip_pixels(x + _unit_l2(delta) * eps, clip_min, clip_max)


def _unit_l2(delta):
    size = tf.sqrt(tf.reduce_sum(tf.square(delta), axis=[1, 2, 3], keepdims=True))
    return delta / (size + _TINY)


def _l2_run(
    model_fn, x, labels, done_margin, sides, iterations, geometry, seeds, *,
    eps, clip_min, clip_max,
):  # fmt: skip
    """One L2 run: each query draws two windows, moves the second window's
    perturbation mass into the first (a fresh `_eta` pattern plus the
    first's old content), and renormalises the whole perturbation to eps."""
    height, width, channels = geometry
    eps_t = tf.cast(eps, x.dtype)
    start = _l2_start(x, seeds, height, width, channels, eps_t, clip_min, clip_max)
    patterns, pattern_at = _padded_patterns(sides)
    size = patterns.shape[-1]
    patterns = tf.constant(patterns.reshape(len(patterns), 2, size * size), x.dtype)
    pattern_at = tf.constant(pattern_at, tf.int32)
    side_at = tf.constant(sides, tf.int32)
    axes = [1, 2]

    def propose(i, x_now, best_now):
        count, side = tf.shape(x_now)[0], side_at[i]
        first, top, left = _window(_step_seeds(seeds, i, 1), count, side, height, width)
        second, _, _ = _window(_step_seeds(seeds, i, 2), count, side, height, width)
        turned = _signs(_step_seeds(seeds, i, 3), tf.stack([count]), tf.float32)
        pattern = tf.gather(patterns[pattern_at[i]], tf.cast(turned > 0, tf.int32))
        rows = tf.clip_by_value(tf.range(height)[None, :] - top, 0, size - 1)
        cols = tf.clip_by_value(tf.range(width)[None, :] - left, 0, size - 1)
        flat = rows[:, :, None] * size + cols[:, None, :]
        fresh = tf.gather(pattern, flat, batch_dims=1)[..., None]
        first_f = tf.cast(first, x.dtype)
        both = tf.cast(first | second, x.dtype)
        delta = best_now - x_now
        window_norm = _norm(delta * first_f, axes)
        image_norm = _norm(delta, [1, 2, 3])
        moved_norm = _norm(delta * both, axes)
        signs = _signs(
            _step_seeds(seeds, i, 4), tf.stack([count, 1, 1, channels]), x.dtype
        )
        new = (fresh * signs + delta / (_TINY + window_norm)) * first_f
        budget = tf.maximum(eps_t**2 - image_norm**2, 0.0) / channels + moved_norm**2
        new = new / (_TINY + _norm(new, axes)) * tf.sqrt(budget)
        delta = delta * (1.0 - both) + new
        return clip_pixels(x_now + _unit_l2(delta) * eps_t, clip_min, clip_max)

    return _search(model_fn, x, labels, done_margin, start, propose, iterations)


def _norm(delta, axes):
    return tf.sqrt(tf.reduce_sum(tf.square(delta), axis=axes, keepdims=True))
