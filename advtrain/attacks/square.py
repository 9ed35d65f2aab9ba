"""Square Attack (Andriushchenko, Croce, Flammarion and Hein, ECCV 2020).

Gradient-free, so gradient masking cannot hide a weakness from it: each
query changes the perturbation inside one random square window (whose
share of the image halves on the paper's schedule) and keeps the change
when it lowers the margin `z_y - max_{j != y} z_j`. Every image draws its
own windows and stops once fooled (on JAX the fooled ones are queried and
ignored: `advtrain.backend.active_indices`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from keras import ops

from advtrain import backend
from advtrain.attacks.common import (
    ModelFn,
    Norm,
    Pieces,
    attack_inputs,
    check_count,
    checked_norm,
    clip_pixels,
    fold_seed,
    int_labels,
    logit_of,
    per_example,
    seed_pair,
)

# Query counts (of 10,000) after which the window's share halves.
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

    `queries` per image and restart count the random start (AutoAttack:
    5,000); `restarts` rerun the images still standing; `p_init` is the
    window's initial share of the image (AutoAttack: 0.8);
    `rescale_schedule` spreads the halvings over `queries` instead of
    10,000 (AutoAttack does not). Returns per example a misclassified
    point if one was found, else the one of smallest margin; with
    `return_queries`, also the queries each image used (int32).

    Example:

    ```python
    x_adv = square(lambda x: model(x, training=False), x, y, eps=0.3)
    ```
    """
    norm = checked_norm(norm, eps)
    check_count("queries", queries, tensor=False)
    check_count("restarts", restarts, tensor=False)
    if not 0.0 < p_init <= 1.0:
        raise ValueError(f"p_init must be in (0, 1]. Received: p_init={p_init!r}")
    pieces = Pieces.of(model_fn, x)
    x, y = attack_inputs(pieces, x, y)
    if ops.ndim(x) != 4:
        raise ValueError(
            "square attacks images of shape (batch, height, width, channels). "
            f"Received: shape={tuple(x.shape)}"
        )
    height, width, channels = (int(d) for d in x.shape[1:])
    labels = int_labels(y)
    iterations = queries - 1  # the random start is the first query
    sides = _window_sides(iterations, p_init, height, width, norm, rescale_schedule)
    # Every stateless draw below follows from these two int32 words.
    base = seed_pair(seed)
    start = _linf_start if norm == "inf" else _l2_start
    tables = _tables(sides, norm)
    geometry = (height, width, channels)
    best, batch = x, ops.shape(x)[0]
    margin = ops.full((batch,), math.inf, "float32")
    used = ops.zeros((batch,), "int32")
    for r in range(restarts):
        seeds = base + ops.convert_to_tensor([0, 1_000_003 * r], "int32")
        box = dict(clip_min=clip_min, clip_max=clip_max)
        first = start(x, seeds, geometry, ops.cast(eps, x.dtype), **box)
        point, run_margin, run_used = _search(
            pieces,
            x,
            labels,
            margin,
            first,
            iterations,
            (tables, seeds, eps),
            norm=norm,
            geometry=geometry,
            **box,
        )
        better = run_margin < margin
        best = ops.where(per_example(better, 4), point, best)
        margin = ops.where(better, run_margin, margin)
        used += run_used
    best = ops.stop_gradient(best)
    return (best, used) if return_queries else best


def share_at(query: int, p_init: float, total: int, rescale: bool) -> float:
    """The window's share of the image at iteration `query` (0-based, the
    random start not counted)."""
    step = int(query / total * 10000) if rescale else query
    halvings = sum(step > mark for mark in _HALVINGS)
    return p_init / 2**halvings


def _window_sides(iterations, p_init, height, width, norm, rescale) -> list[int]:
    smallest = 1 if norm == "inf" else 3
    sides = []
    for i in range(max(iterations, 1)):
        share = share_at(i, p_init, max(iterations, 1), rescale)
        side = max(int(round(math.sqrt(share * height * width))), smallest)
        if norm == "2" and side % 2 == 0:
            side += 1
        sides.append(min(side, height, width))
    return sides


def margin_of(logits: Any, labels: Any) -> Any:
    """`z_y - max_{j != y} z_j` per example (negative: misclassified)."""
    logits = ops.cast(logits, "float32")
    is_true = ops.cast(ops.one_hot(labels, ops.shape(logits)[-1]), "bool")
    others = ops.where(is_true, ops.full_like(logits, -math.inf), logits)
    return logit_of(logits, labels) - ops.max(others, axis=-1)


def _uniform_int(seeds, count, high):
    # Per image, an int32 drawn uniformly from [0, high), shape (count, 1).
    unit = backend.stateless_uniform((count, 1), seeds)
    draw = ops.cast(ops.floor(unit * ops.cast(high, "float32")), "int32")
    return ops.minimum(draw, high - 1)  # float rounding at the top end


def _window(seeds, count, side, height, width):
    # Per image, a random `side` x `side` window: a (count, height, width, 1)
    # mask and the top-left corners.
    top = _uniform_int(seeds, count, height - side + 1)
    left = _uniform_int(
        seeds + ops.convert_to_tensor([0, 1], "int32"), count, width - side + 1
    )
    in_rows = _inside(ops.arange(height, dtype="int32")[None, :], top, side)
    in_cols = _inside(ops.arange(width, dtype="int32")[None, :], left, side)
    mask = in_rows[:, :, None, None] & in_cols[:, None, :, None]
    return mask, top, left


def _inside(position, first, side):
    return (position >= first) & (position < first + side)


def _signs(seeds, shape, dtype):
    draw = backend.stateless_uniform(shape, seeds)
    return ops.cast(ops.where(draw < 0.5, -1.0, 1.0), dtype)


def _search(pieces, x, labels, done_margin, start, iterations, arrays, **static):
    # The query loop of both norms: each query proposes candidates for the
    # images still standing (margin > 0), kept where they lower the
    # margin, until every image is fooled. One compiled loop, inline or as
    # one piece from the host: queries take no input gradient, so an
    # XLA:CPU while loop keeps its fast convolutions.
    margin = margin_of(pieces(start), labels)
    # Images an earlier restart fooled stay out of this run.
    margin = ops.where(done_margin <= 0, done_margin, margin)
    used = ops.cast(done_margin > 0, "int32")
    state = (start, margin, used)
    return pieces.run(_queries, x, labels, state, iterations, arrays, **static)


def _queries(model_fn, x, labels, state, iterations, arrays, *, norm, **static):
    # The queries from `state`: (best, margin, used).
    propose = (_linf_proposer if norm == "inf" else _l2_proposer)(x, *arrays, **static)

    def body(i, best, margin, used):
        index = backend.active_indices(margin > 0)
        x_now, best_now = ops.take(x, index, axis=0), ops.take(best, index, axis=0)
        margin_now = ops.take(margin, index, axis=0)
        candidate = propose(i, x_now, best_now)
        new_margin = margin_of(model_fn(candidate), ops.take(labels, index, axis=0))
        live = margin_now > 0
        improved = live & (new_margin < margin_now)
        at = ops.expand_dims(index, -1)
        best = ops.scatter_update(
            best, at, ops.where(per_example(improved, 4), candidate, best_now)
        )
        margin = ops.scatter_update(
            margin, at, ops.where(live, ops.minimum(new_margin, margin_now), margin_now)
        )
        counted = ops.take(used, index, axis=0) + ops.cast(live, "int32")
        return i + 1, best, margin, ops.scatter_update(used, at, counted)

    def more(i, best, margin, used):
        return ops.logical_and(ops.less(i, iterations), ops.any(margin > 0))

    loop = (ops.convert_to_tensor(0, "int32"), *state)
    _, *state = ops.while_loop(more, body, loop)
    return tuple(state)


def _tables(sides: list[int], norm: str) -> dict:
    # The per-query window sides (and L2 patterns) as arrays.
    tables = {"side_at": np.asarray(sides, np.int32)}
    if norm == "2":
        patterns, pattern_at = _padded_patterns(sides)
        size = patterns.shape[-1]
        tables["patterns"] = patterns.reshape(len(patterns), 2, size * size)
        tables["pattern_at"] = np.asarray(pattern_at, np.int32)
    return tables


def _linf_start(x, seeds, geometry, eps, *, clip_min, clip_max):
    # AutoAttack adds +-2 eps and projects: the same points.
    width, channels = geometry[1:]
    stripes = _signs(seeds, (ops.shape(x)[0], 1, width, channels), x.dtype)
    return clip_pixels(x + eps * stripes, clip_min, clip_max)


def _linf_proposer(x, tables, seeds, eps, *, geometry, clip_min, clip_max):
    # Each query sets one window to +-eps per channel around `x`.
    height, width, channels = geometry
    eps_t = ops.cast(eps, x.dtype)
    side_at = ops.convert_to_tensor(tables["side_at"], "int32")

    def propose(i, x_now, best_now):
        count, side = ops.shape(x_now)[0], ops.take(side_at, i)
        mask, _, _ = _window(fold_seed(seeds, i, 1), count, side, height, width)
        signs = _signs(fold_seed(seeds, i, 2), (count, 1, 1, channels), x.dtype)
        candidate = ops.where(mask, x_now + eps_t * signs, best_now)
        return clip_pixels(candidate, clip_min, clip_max)

    return propose


def _eta_rectangles(rows: int, cols: int) -> np.ndarray:
    # Nested rectangles around the centre, weight 1 / (k + 1)^2 for the
    # k-th, unit L2 norm.
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
    # The paper's L2 window pattern: positive rectangles over negative ones.
    top = _eta_rectangles(side // 2, side)
    bottom = -_eta_rectangles(side - side // 2, side)
    delta = np.concatenate([top, bottom], axis=0)
    return delta / np.sqrt(np.sum(delta**2))


def _padded_patterns(sides: list[int]) -> tuple[np.ndarray, list[int]]:
    # `_eta` of each distinct side, zero-padded to the largest, as an array
    # (pattern, orientation, row, col); and per iteration its pattern.
    distinct = sorted(set(sides))
    size = max(distinct)
    patterns = np.zeros((len(distinct), 2, size, size), np.float32)
    for k, side in enumerate(distinct):
        eta = _eta(side)
        patterns[k, 0, :side, :side] = eta
        patterns[k, 1, :side, :side] = eta.T
    return patterns, [distinct.index(s) for s in sides]


def _l2_start(x, seeds, geometry, eps, *, clip_min, clip_max):
    # AutoAttack's: a grid of `_eta` blocks of side height // 5, each with a
    # random sign per channel and orientation, scaled to norm eps.
    height, width, channels = geometry
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
    count = ops.shape(x)[0]
    signs = _signs(seeds, (count, index + 1, channels), x.dtype)
    turned = _signs(fold_seed(seeds, -1, 3), (count, index + 1), x.dtype)
    where = ops.convert_to_tensor(np.maximum(block, 0), "int32")
    inside = ops.convert_to_tensor((block >= 0)[None, :, :, None])
    pattern = ops.where(
        ops.take(turned, where, axis=1)[..., None] > 0,
        ops.convert_to_tensor(canvas[0][None, :, :, None], x.dtype),
        ops.convert_to_tensor(canvas[1][None, :, :, None], x.dtype),
    )
    delta = pattern * ops.take(signs, where, axis=1)
    delta = ops.where(inside, delta, ops.zeros_like(delta))
    return clip_pixels(x + _unit_l2(delta) * eps, clip_min, clip_max)


def _unit_l2(delta):
    return delta / (_norm(delta, (1, 2, 3)) + _TINY)


def _l2_proposer(x, tables, seeds, eps, *, geometry, clip_min, clip_max):
    # Each query moves the second window's perturbation mass into the first
    # (a fresh `_eta` plus its old content) and renormalises to eps.
    height, width, channels = geometry
    eps_t = ops.cast(eps, x.dtype)
    patterns = ops.convert_to_tensor(tables["patterns"], x.dtype)
    size = math.isqrt(int(patterns.shape[-1]))
    pattern_at = ops.convert_to_tensor(tables["pattern_at"], "int32")
    side_at = ops.convert_to_tensor(tables["side_at"], "int32")
    axes = (1, 2)

    def propose(i, x_now, best_now):
        count, side = ops.shape(x_now)[0], ops.take(side_at, i)
        first, top, left = _window(fold_seed(seeds, i, 1), count, side, height, width)
        second, _, _ = _window(fold_seed(seeds, i, 2), count, side, height, width)
        turned = _signs(fold_seed(seeds, i, 3), (count,), "float32")
        pattern = ops.take(
            ops.take(patterns, ops.take(pattern_at, i), axis=0),
            ops.cast(turned > 0, "int32"),
            axis=0,
        )
        rows = ops.clip(ops.arange(height, dtype="int32")[None, :] - top, 0, size - 1)
        cols = ops.clip(ops.arange(width, dtype="int32")[None, :] - left, 0, size - 1)
        flat = ops.reshape(rows[:, :, None] * size + cols[:, None, :], (count, -1))
        fresh = ops.reshape(
            ops.take_along_axis(pattern, flat, axis=1), (count, height, width, 1)
        )
        first_f = ops.cast(first, x.dtype)
        both = ops.cast(first | second, x.dtype)
        delta = best_now - x_now
        window_norm = _norm(delta * first_f, axes)
        image_norm = _norm(delta, (1, 2, 3))
        moved_norm = _norm(delta * both, axes)
        signs = _signs(fold_seed(seeds, i, 4), (count, 1, 1, channels), x.dtype)
        new = (fresh * signs + delta / (_TINY + window_norm)) * first_f
        room = ops.maximum(eps_t**2 - image_norm**2, ops.cast(0.0, x.dtype))
        budget = room / channels + moved_norm**2
        new = new / (_TINY + _norm(new, axes)) * ops.sqrt(budget)
        delta = delta * (1.0 - both) + new
        return clip_pixels(x_now + _unit_l2(delta) * eps_t, clip_min, clip_max)

    return propose


def _norm(delta, axes):
    return ops.sqrt(ops.sum(ops.square(delta), axis=axes, keepdims=True))
