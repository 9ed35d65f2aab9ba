"""Auto-PGD (Croce and Hein 2020): APGD-CE and targeted APGD-DLR, the two
gradient attacks of AutoAttack.

The step size starts at `2 * eps` and is halved, per example, at
checkpoints where the loss stopped rising; a momentum term smooths the
steps. The DLR loss is invariant to rescaling the logits. Where the paper
and the authors' code (fra31/auto-attack) differ, `checkpoints` and
`_apgd_run` say which is taken.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from keras import ops

from advtrain import backend
from advtrain.attacks.common import (
    LossFn,
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
    per_example_cross_entropy,
    predicted,
    project,
    random_in_ball,
    reduce_axes,
    runs_until_fooled,
    seed_pair,
    steepest_step,
    worse_of,
)

# Paper, section 3.2: checkpoints p_0 = 0, p_1 = 0.22, then intervals that
# shrink by 0.03 down to a minimum of 0.06 of the iterations.
_P1, _SHRINK, _MIN_INTERVAL = 0.22, 0.03, 0.06
_DLR_TINY = 1e-12
DEFAULT_TARGETS = 9  # AutoAttack's APGD-T: the 9 most likely wrong classes


def apgd_ce(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    steps: int = 100,
    norm: Norm = "inf",
    restarts: int = 1,
    loss_fn: Optional[LossFn] = None,
    rho: float = 0.75,
    momentum: float = 0.75,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
) -> Any:
    """APGD on the cross-entropy loss (AutoAttack's first attack).

    Per example, returns a misclassified point if one was found, else the
    point of highest loss. `steps` are per restart (AutoAttack: 100);
    `rho`: halve the step at a checkpoint when the loss rose in at most
    this share of the iterations since the last one; `momentum`: weight of
    the new step against the previous move. The other arguments as `pgd`.

    Example:

    ```python
    x_adv = apgd_ce(lambda x: model(x, training=False), x, y, eps=0.3)
    ```
    """
    norm = _validate(eps, norm, steps, restarts, rho, momentum)
    pieces = _pieces(model_fn, x, loss_scale)
    x, y = attack_inputs(pieces, x, y)
    labels = int_labels(y)
    # Every run attacks the same loss.
    loss = dict(kind="ce", loss_fn=loss_fn or per_example_cross_entropy)
    return _best_over_runs(
        pieces,
        x,
        (y, labels),
        lambda run: labels,
        restarts,
        eps=eps,
        steps=steps,
        norm=norm,
        rho=rho,
        momentum=momentum,
        clip_min=clip_min,
        clip_max=clip_max,
        loss_scale=loss_scale,
        seed=seed,
        **loss,
    )


def apgd_dlr(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    steps: int = 100,
    norm: Norm = "inf",
    targets: int = DEFAULT_TARGETS,
    restarts: int = 1,
    rho: float = 0.75,
    momentum: float = 0.75,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
    seed: Any = None,
) -> Any:
    """APGD on the (targeted) Difference of Logits Ratio loss.

    Targeted (AutoAttack's APGD-T), for each of the `targets` classes
    (at most classes - 1) the model ranks highest after the true one on
    the clean input, in turn, with `restarts` runs each: maximise
    `-(z_y - z_t) / (z_1 - (z_3 + z_4) / 2)`, `z_1 >= z_2 >= ...` the
    sorted logits (at least 4 classes). `targets=0` runs the untargeted
    `-(z_y - max_{i != y} z_i) / (z_1 - z_3)` instead (3 classes). Stops
    once every example is misclassified. The rest as `apgd_ce`.

    Example:

    ```python
    x_adv = apgd_dlr(lambda x: model(x, training=False), x, y, eps=0.3)
    ```
    """
    norm = _validate(eps, norm, steps, restarts, rho, momentum)
    if not isinstance(targets, int) or isinstance(targets, bool) or targets < 0:
        raise ValueError(f"targets must be an int >= 0. Received: targets={targets!r}")
    pieces = _pieces(model_fn, x, loss_scale)
    x, y = attack_inputs(pieces, x, y)
    labels = int_labels(y)
    clean_logits = pieces(x)
    targets = _usable_targets(targets, clean_logits.shape[-1])
    # Classes by decreasing clean logit; target k is the (k + 2)-th, as in
    # AutoAttack (for a correctly classified input: the k-th wrong class).
    ranked = ops.argsort(-ops.cast(clean_logits, "float32"), axis=-1)

    def target_of(run):
        if not targets:
            return labels  # the untargeted loss has no target
        return ops.take(ranked, run // restarts + 1, axis=1)

    runs = restarts * max(targets, 1)
    return _best_over_runs(
        pieces,
        x,
        (y, labels),
        target_of,
        runs,
        eps=eps,
        steps=steps,
        norm=norm,
        rho=rho,
        momentum=momentum,
        clip_min=clip_min,
        clip_max=clip_max,
        loss_scale=loss_scale,
        seed=seed,
        kind="dlr_t" if targets else "dlr",
        loss_fn=None,
    )


def _pieces(model_fn, x, loss_scale) -> Pieces:
    # A loss scale (a tensor) keeps the loops inline.
    if loss_scale is not None and not isinstance(model_fn, Pieces):
        return Pieces(model_fn)
    return Pieces.of(model_fn, x)


def _usable_targets(targets: int, classes: Optional[int]) -> int:
    needed = 4 if targets else 3
    if classes is not None and classes < needed:
        raise ValueError(
            f"The {'targeted ' if targets else ''}DLR loss needs at least "
            f"{needed} classes. Received: classes={classes}"
        )
    if targets and classes is not None:
        targets = min(targets, classes - 1)
    return targets


def checkpoints(steps: int) -> list[int]:
    """Iteration counts w_j after which the step size is reviewed.

    `w_j = ceil(p_j * steps)` with `p_0 = 0`, `p_1 = 0.22` and
    `p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)` (paper, eq. 4),
    deduplicated, up to `steps`. The authors' code shrinks integer
    intervals instead (22, 19, 16, ... for 100 steps); the two differ by
    at most an iteration per checkpoint.
    """
    p = [0.0, _P1]
    while True:
        nxt = p[-1] + max(p[-1] - p[-2] - _SHRINK, _MIN_INTERVAL)
        if nxt > 1:
            break
        p.append(nxt)
    # Rounding first: 0.22 * 100 is 22.000000000000004, whose ceil is 23.
    counts = sorted({math.ceil(round(v * steps, 6)) for v in p})
    return [w for w in counts if w <= steps]


def _validate(eps, norm, steps, restarts, rho, momentum) -> str:
    norm = checked_norm(norm, eps)
    # Python ints: the step-size checkpoints are computed on the host.
    check_count("steps", steps, tensor=False)
    check_count("restarts", restarts, tensor=False)
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1]. Received: rho={rho!r}")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be in [0, 1]. Received: momentum={momentum!r}")
    return norm


def _dlr(logits: Any, labels: Any) -> Any:
    logits = ops.cast(logits, "float32")
    top = ops.top_k(logits, k=3)[0]
    true = logit_of(logits, labels)
    # The largest other logit: the top one, or the second when y is on top.
    other = ops.where(true >= top[:, 0], top[:, 1], top[:, 0])
    return -(true - other) / (top[:, 0] - top[:, 2] + _DLR_TINY)


def _dlr_targeted(logits: Any, labels: Any, target: Any) -> Any:
    logits = ops.cast(logits, "float32")
    top = ops.top_k(logits, k=4)[0]
    true, aim = logit_of(logits, labels), logit_of(logits, ops.cast(target, "int32"))
    scale = top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + _DLR_TINY
    return -(true - aim) / scale


def _objective(kind: str, loss_fn, y, labels, target):
    # The loss a run ascends, of the logits.
    if kind == "ce":
        return lambda logits: loss_fn(y, logits)
    if kind == "dlr":
        return lambda logits: _dlr(logits, labels)
    return lambda logits: _dlr_targeted(logits, labels, target)


def _loss_gradient_wrong(model_fn, x, labels, objective, loss_scale):
    # Per-example loss, its input gradient and whether the model is wrong,
    # from one forward pass.

    def total(z):
        logits = model_fn(z)
        loss = ops.cast(objective(logits), "float32")
        value = ops.sum(loss)
        if loss_scale is not None:
            value = value * ops.cast(loss_scale, "float32")
        return value, (loss, logits)

    (_, (loss, logits)), grad = backend.value_and_grad(total, x)
    grad = backend.finite_or_zero(grad)
    return loss, grad, predicted(logits) != labels


def _best_over_runs(pieces, x, given, target_of, runs, seed, steps, **options):
    # Run r attacks its loss towards `target_of(r)`; per example the worst
    # case (`worse_of`), until every example is misclassified. Each run
    # draws its start from its own folded seed.
    pair = seed_pair(seed)

    def body(run, *best):
        target = target_of(run)
        found = _apgd_run(
            pieces, x, given, target, fold_seed(pair, run), steps, **options
        )
        return (run + 1, *worse_of(best, found))

    batch = ops.shape(x)[0]
    none_yet = (ops.zeros((batch,), "bool"), ops.full((batch,), -math.inf, "float32"))
    state = (ops.convert_to_tensor(0, "int32"), x, *none_yet)
    _, best, _, _ = runs_until_fooled(pieces, body, state, runs)
    return ops.stop_gradient(best)


def _apgd_run(pieces, x, given, target, seed, steps, *, eps, **options):
    # One run (paper, Algorithm 1): per example the last misclassified
    # point (else the highest-loss one), whether one was found, the highest
    # loss; its start, then its steps in one loop or in chunks.
    arrays = (x, given, target, eps)
    s = pieces.run(_apgd_start, *arrays, seed, **_start_options(options))
    for first, count in pieces.spans(steps):
        s = pieces.run(
            _apgd_steps, *arrays, first, s, count=count, steps=steps, **options
        )
    point = _where(s["fooled"], s["adversarial"], s["best"])
    return point, s["fooled"], s["best_loss"]


def _start_options(options: dict) -> dict:
    return {k: v for k, v in options.items() if k not in ("rho", "momentum")}


def _tools(model_fn, x, given, target, eps, *, norm, clip_min, clip_max, **loss):
    # The run's projection onto the ball and its loss, gradient, verdict.
    y, labels = given
    objective = _objective(loss["kind"], loss["loss_fn"], y, labels, target)
    eps_t = ops.cast(eps, x.dtype)

    def to_ball(point):
        delta = project(clip_pixels(point, clip_min, clip_max) - x, eps_t, norm)
        return clip_pixels(x + delta, clip_min, clip_max)

    def gradient_at(point):
        scale = loss["loss_scale"]
        return _loss_gradient_wrong(model_fn, point, labels, objective, scale)

    return eps_t, to_ball, gradient_at


def _apgd_start(model_fn, x, given, target, eps, seed, **options) -> dict:
    # The start is on the surface of the eps-ball (the authors' code), the
    # step 2 eps.
    eps_t, to_ball, gradient_at = _tools(model_fn, x, given, target, eps, **options)
    start = to_ball(x + _on_sphere(x, eps_t, options["norm"], seed))
    return _first_state(start, *gradient_at(start), eta=2.0 * eps_t)


def _apgd_steps(
    model_fn, x, given, target, eps, first, s, *, count, steps, rho, momentum, **options
) -> dict:
    # Iterations first .. first + count - 1 of `steps`. Where the paper
    # leaves it open, the authors' code decides: condition 1 halves the
    # step when the loss rose in at most `rho` of the interval (the paper:
    # "fewer than"); after a halving the search resumes at the best point
    # with its gradient, and the momentum term keeps the previous point.
    _, to_ball, gradient_at = _tools(model_fn, x, given, target, eps, **options)
    interval = _intervals(steps)
    norm = options["norm"]

    def body(i, s):
        s = _step(i, s, to_ball, gradient_at, norm, momentum)
        length = ops.take(interval, i)
        return i + 1, ops.cond(length > 0, lambda: _review(s, length, rho), lambda: s)

    state = (ops.convert_to_tensor(first, "int32"), s)
    _, s = backend.counted_loop(body, state, count)
    return s


def _where(mask: Any, a: Any, b: Any) -> Any:
    # `a` for the examples in `mask`, else `b`.
    return ops.where(per_example(mask, ops.ndim(a)), a, b)


def _first_state(start, loss, grad, wrong, *, eta) -> dict:
    # A run's state at its start: every point the start, the step `eta`.
    batch, rank = ops.shape(start)[0], ops.ndim(start)
    return dict(
        current=start,
        previous=start,
        best=start,
        adversarial=start,
        grad=grad,
        best_grad=grad,
        loss=loss,
        best_loss=loss,
        best_at_check=loss,
        fooled=wrong,
        eta=ops.full((batch,) + (1,) * (rank - 1), eta, start.dtype),
        rises=ops.zeros((batch,), "float32"),
        halved_at_check=ops.zeros((batch,), "bool"),
    )


def _step(i, s: dict, to_ball, gradient_at, norm: str, momentum: float) -> dict:
    # Iteration i: the momentum step from the current point, then the best
    # and the misclassified points kept.
    dtype = s["current"].dtype
    # The first step has no momentum (the paper's x^(1)).
    a = ops.where(i > 0, ops.cast(momentum, dtype), ops.cast(1.0, dtype))
    z = to_ball(s["current"] + steepest_step(s["grad"], 1.0, norm) * s["eta"])
    moved = to_ball(
        s["current"] + a * (z - s["current"]) + (1 - a) * (s["current"] - s["previous"])
    )
    loss, grad, wrong = gradient_at(moved)
    improved = loss > s["best_loss"]
    return dict(
        s,
        previous=s["current"],
        current=moved,
        grad=grad,
        loss=loss,
        best=_where(improved, moved, s["best"]),
        best_grad=_where(improved, grad, s["best_grad"]),
        best_loss=ops.where(improved, loss, s["best_loss"]),
        adversarial=_where(wrong, moved, s["adversarial"]),
        fooled=s["fooled"] | wrong,
        rises=s["rises"] + ops.cast(loss > s["loss"], "float32"),
    )


def _intervals(steps: int) -> Any:
    # Per iteration i: w_j - w_{j-1} when it completes the w_j-th step, else 0.
    marks = checkpoints(steps)
    interval = [0.0] * steps
    for before, after in zip(marks[:-1], marks[1:], strict=True):
        interval[after - 1] = float(after - before)
    return ops.convert_to_tensor(interval, "float32")


def _review(s: dict, length: Any, rho: float) -> dict:
    # The checkpoint: halve the step where the loss rose too rarely
    # (condition 1) or where the step was not halved last time and the best
    # loss has not improved since (condition 2); those resume at their best.
    rank = ops.ndim(s["current"])
    rarely = s["rises"] <= rho * length
    stalled = ~s["halved_at_check"] & (s["best_at_check"] >= s["best_loss"])
    halve = rarely | stalled
    mask = per_example(halve, rank)
    return dict(
        s,
        eta=ops.where(mask, s["eta"] / 2, s["eta"]),
        current=ops.where(mask, s["best"], s["current"]),
        grad=ops.where(mask, s["best_grad"], s["grad"]),
        loss=ops.where(halve, s["best_loss"], s["loss"]),
        rises=ops.zeros_like(s["rises"]),
        best_at_check=s["best_loss"],
        halved_at_check=halve,
    )


def _on_sphere(x: Any, eps: Any, norm: str, seed: Any) -> Any:
    # A random perturbation of norm exactly eps (AutoAttack's start).
    noise = random_in_ball(x, 1.0, norm, seed)
    axes = reduce_axes(x)
    if norm == "inf":
        size = ops.max(ops.abs(noise), axis=axes, keepdims=True)
    else:
        size = ops.sqrt(ops.sum(ops.square(noise), axis=axes, keepdims=True))
    return eps * noise / (size + ops.cast(1e-12, x.dtype))
