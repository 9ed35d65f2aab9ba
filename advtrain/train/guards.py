"""`CatastrophicOverfittingGuard` (FGSM training's sudden collapse) and
`first_nonfinite_variable` (the one finite-value check)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional, Union

import keras
import numpy as np

from advtrain import backend
from advtrain.attacks import pgd
from advtrain.attacks.common import check_count
from advtrain.evaluation.verdict import CATASTROPHIC_OVERFITTING, EXIT_CODES
from advtrain.utils.io import atomic_path
from advtrain.utils.progress import Echo

ACTIONS = ("stop", "rollback")
KEEPS = ("best", "last")

# A run's exit code when the guard passed no epoch as sound (`unsound`):
# the verdict's, one definition.
COLLAPSED_EXIT_CODE = EXIT_CODES[CATASTROPHIC_OVERFITTING]


def first_nonfinite_variable(
    state: Union[keras.layers.Layer, Iterable[keras.Variable]],
) -> Optional[str]:
    """The path of the first float variable that holds NaN or Inf, or None:
    the one finite-value check, of a model's weights (BatchNorm statistics
    included) or of the variables given. One host sync in all.

    Example:

    ```python
    name = first_nonfinite_variable(model)  # None, or "dense/kernel"
    ```
    """
    if isinstance(state, keras.layers.Layer):
        state = state.weights
    variables = [v for v in state if "float" in str(v.dtype)]
    if not variables:
        return None
    ops = keras.ops
    finite = ops.stack([ops.all(ops.isfinite(v.value)) for v in variables])
    bad = np.flatnonzero(~ops.convert_to_numpy(finite))
    return str(variables[bad[0]].path) if bad.size else None


# The largest gap (training attack's accuracy minus the guard's PGD
# accuracy) an epoch trained at full eps may show and still be kept as
# sound. The healthy MNIST runs measured never exceeded +13.2 points
# after the eps ramp; the collapses measured (plain FGSM on mnist_fgsm_rs)
# show +24.7 to +95, epochs under the 50-point rollback limit included.
# 20 is about midway. See docs/robustness.md, "Why the limits are where
# they are".
SOUND_GAP = 0.2


class CatastrophicOverfittingGuard(keras.callbacks.Callback):
    """Watches PGD accuracy on a fixed training batch; acts when it collapses.

    FGSM training can overfit catastrophically: PGD accuracy falls to about
    zero while the training attack's climbs (Wong, Rice and Kolter 2020).
    After every epoch this runs PGD on the same examples and random start
    and keeps the best epoch's weights. An epoch collapsed when its PGD
    accuracy fell more than `drop` below the best, or when, at full eps
    from its first step, its `adv_accuracy` log is more than `max_gap`
    above its PGD accuracy. The guard then restores the best weights and
    optimizer moments, if any, and stops or goes on (`action`). An epoch
    whose gap is above `sound_gap()` (at most `SOUND_GAP`) is never kept
    as the best, nor at the end of training. When no epoch's gap was
    within it, `finish()` sets `unsound` (a run exits with
    `COLLAPSED_EXIT_CODE`). It logs `co_guard_pgd_accuracy`.

    Args:
        x, y: the fixed training batch: [0, 1] pixels and integer labels.
        eps: attack radius, in pixel units (the training eps).
        norm: "inf" or 2.
        steps: PGD steps; the step size is `2.5 * eps / steps`.
        drop: fall in PGD accuracy from the best epoch, in (0, 1].
        max_gap: the training attack's accuracy above PGD accuracy, in
            (0, 1]; None: no gap check.
        action: "stop" or "rollback".
        echo: receives one line per collapse.
        classifier: the model to attack; default the trained model's
            `classifier` (AdversarialModel), else the model.
        seed: seed of the PGD random start.
        state_path: a `.npz` written after every epoch (see `load_state`).
        keep: "best": `finish()` restores the best epoch's weights when
            training ends more than `keep_margin()` below; "last": not.

    Example:

    ```python
    guard = CatastrophicOverfittingGuard(x[:256], y[:256], eps=0.3)
    model.fit(train_ds, epochs=10, callbacks=[guard])
    guard.triggers  # [] when nothing collapsed
    guard.unsound  # None, or why no epoch it could keep was sound
    ```
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        *,
        eps: float,
        norm: str = "inf",
        steps: int = 10,
        drop: float = 0.2,
        max_gap: Optional[float] = 0.5,
        action: str = "rollback",
        echo: Echo = print,
        classifier: Optional[keras.Model] = None,
        seed: int = 0,
        state_path: Union[str, Path, None] = None,
        keep: str = "best",
    ):
        super().__init__()
        if keep not in KEEPS:
            raise ValueError(
                f"keep must be one of {', '.join(KEEPS)}. Received: keep={keep!r}"
            )
        if action not in ACTIONS:
            raise ValueError(
                f"action must be one of {', '.join(ACTIONS)}. "
                f"Received: action={action!r}"
            )
        if not 0.0 < drop <= 1.0:
            raise ValueError(f"drop must be in (0, 1]. Received: drop={drop!r}")
        if max_gap is not None and not 0.0 < max_gap <= 1.0:
            raise ValueError(
                f"max_gap must be in (0, 1] or None. Received: max_gap={max_gap!r}"
            )
        check_count("steps", steps)
        self.x = np.asarray(x, np.float32)
        self.y = np.asarray(y).reshape(-1).astype(np.int32)
        if self.x.shape[0] == 0 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                "x and y must hold the same number (>= 1) of examples. "
                f"Received: x.shape={tuple(self.x.shape)}, "
                f"y.shape={tuple(self.y.shape)}"
            )
        self.eps, self.norm, self.steps, self.seed = eps, norm, steps, seed
        self.drop, self.max_gap, self.action, self.keep = drop, max_gap, action, keep
        self.echo = echo
        self.classifier = classifier
        self.final: Optional[dict[str, Any]] = None
        # `advtrain.fit` fits once per phase and calls `finish()` itself.
        self.finish_on_train_end = True
        self.accuracies: list[tuple[int, float]] = []
        self.triggers: list[dict[str, Any]] = []
        # (epoch, training attack's accuracy - PGD accuracy), for the
        # epochs trained at full eps that logged `adv_accuracy`.
        self.gaps: list[tuple[int, float]] = []
        self.unsound: Optional[dict[str, Any]] = None
        self._full_eps = False
        self.best_accuracy = -1.0
        self.best_epoch: Optional[int] = None
        self._best_weights: Optional[list[np.ndarray]] = None
        self._best_slots: Optional[list[np.ndarray]] = None
        self._measure: Optional[Callable] = None
        self.state_path = None if state_path is None else Path(state_path)

    def _target(self) -> keras.Model:
        if self.classifier is not None:
            return self.classifier
        return getattr(self.model, "classifier", self.model)

    def robust_accuracy(self) -> float:
        """PGD accuracy of the current weights on the fixed batch."""
        if self._measure is None:
            target = self._target()
            eps, norm, steps, seed = self.eps, self.norm, self.steps, self.seed

            def measure(x, y):
                model_fn = lambda z: target(z, training=False)  # noqa: E731
                x_adv = pgd(model_fn, x, y, eps=eps, steps=steps, norm=norm, seed=seed)
                hits = keras.ops.equal(keras.ops.argmax(model_fn(x_adv), axis=-1), y)
                return keras.ops.mean(keras.ops.cast(hits, "float32"))

            signature = [(self.x.shape, "float32"), (self.y.shape, "int32")]
            self._measure = backend.compile_function(
                measure, signature, target.variables
            )
        return float(self._measure(self.x, self.y))

    def _optimizer_slots(self) -> list:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return []
        # The step count and learning rate go on: a rollback should not
        # replay the schedule, only undo what the bad epochs learned.
        schedule = ("iteration", "iterations", "learning_rate")
        return [v for v in optimizer.variables if not v.path.endswith(schedule)]

    def _snapshot(self) -> None:
        self._best_weights = [np.copy(w) for w in self.model.get_weights()]
        self._best_slots = [np.copy(v.numpy()) for v in self._optimizer_slots()]

    def _restore(self) -> None:
        self.model.set_weights(self._best_weights)
        slots = self._optimizer_slots()
        if self._best_slots is not None and len(slots) == len(self._best_slots):
            for variable, value in zip(slots, self._best_slots, strict=True):
                variable.assign(value)

    def on_epoch_begin(self, epoch, logs=None):
        self._full_eps = self._trains_at_full_eps()

    def on_epoch_end(self, epoch, logs=None):
        self._judge(epoch, logs)
        if self.state_path is not None:
            self.save_state(self.state_path)

    def _trains_at_full_eps(self) -> bool:
        # Whether the model's eps ramp (`eps_ramp_steps`) has ended.
        ramp = getattr(self.model, "eps_ramp_steps", 0) or 0
        if not ramp:
            return True
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return False
        # The step at 0-based iteration t attacks at min(1, (t + 1) / ramp).
        return int(optimizer.iterations.numpy()) + 1 >= ramp

    def _gap(self, logs, accuracy: float) -> Optional[tuple[float, float]]:
        # (training attack's accuracy, its gap to `accuracy`), or None.
        if self.max_gap is None or not self._full_eps or not logs:
            return None
        attack_accuracy = logs.get("adv_accuracy")
        if attack_accuracy is None:
            return None
        attack_accuracy = float(attack_accuracy)
        return attack_accuracy, attack_accuracy - accuracy

    def _judge(self, epoch, logs) -> None:
        accuracy = self.robust_accuracy()
        if logs is not None:
            logs["co_guard_pgd_accuracy"] = accuracy
        self.accuracies.append((epoch + 1, accuracy))
        judged = self._gap(logs, accuracy)
        if judged is not None:
            self.gaps.append((epoch + 1, judged[1]))
            if judged[1] > self.max_gap:
                self._collapse(epoch + 1, accuracy, attack_accuracy=judged[0])
                return
        if accuracy > self.best_accuracy and not self._suspect(epoch + 1):
            self.best_accuracy, self.best_epoch = accuracy, epoch + 1
            self._snapshot()
            return
        if self.best_accuracy - accuracy > self.drop:
            self._collapse(epoch + 1, accuracy)

    def sound_gap(self) -> Optional[float]:
        """The largest gap an epoch kept as sound may show: `SOUND_GAP`, or
        `max_gap` when lower; None when the gap is not checked."""
        return None if self.max_gap is None else min(SOUND_GAP, self.max_gap)

    def _suspect(self, epoch: int) -> bool:
        # Whether the epoch's gap, if judged, is above `sound_gap()`.
        gap = dict(self.gaps).get(epoch)
        return gap is not None and gap > self.sound_gap()

    def _collapse(
        self, epoch: int, accuracy: float, attack_accuracy: Optional[float] = None
    ) -> None:
        kept = self._best_weights is not None
        self.triggers.append(
            {
                "epoch": epoch,
                "pgd_accuracy": accuracy,
                "best_accuracy": self.best_accuracy if kept else None,
                "best_epoch": self.best_epoch if kept else None,
                "action": self.action,
                "reason": "drop" if attack_accuracy is None else "gap",
                "attack_accuracy": attack_accuracy,
            }
        )
        n = int(self.y.shape[0])
        if attack_accuracy is None:
            what = (
                f"PGD accuracy on {n} training examples fell to "
                f"{100 * accuracy:.1f}% from {100 * self.best_accuracy:.1f}% "
                f"(epoch {self.best_epoch})"
            )
        else:
            what = (
                f"the training attack's accuracy {100 * attack_accuracy:.1f}% "
                f"is {100 * (attack_accuracy - accuracy):.1f} points above "
                f"PGD-{self.steps}'s {100 * accuracy:.1f}% on {n} training "
                f"examples (limit {100 * self.max_gap:g})"
            )
        if kept:
            self._restore()
            what += f"; restored the epoch {self.best_epoch} weights"
        else:
            what += "; no earlier epoch to restore"
        then = "stopping training" if self.action == "stop" else "training goes on"
        self.echo(f"catastrophic overfitting at epoch {epoch}: {what}, {then}")
        if self.action == "stop":
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.finish_on_train_end:
            self.finish()

    def finish(self) -> Optional[dict[str, Any]]:
        """Keeps the best epoch (`keep="best"`), returning what it did or
        None; then sets `unsound` (and says so) when no epoch was sound."""
        final = self._keep_best()
        self.unsound = self._verdict()
        if self.unsound is not None:
            self.echo(self.unsound["message"])
        return final

    def _keep_best(self) -> Optional[dict[str, Any]]:
        if self.keep != "best" or self._best_weights is None:
            return None
        if not self.accuracies or self.model is None:
            return None
        last_epoch, last = self.accuracies[-1]
        if self.triggers and self.triggers[-1]["epoch"] == last_epoch:
            return None  # that epoch's trigger already restored the best
        suspect = self._suspect(last_epoch)
        if not suspect and self.best_accuracy - last <= self.keep_margin():
            return None  # the last epoch is as good as the best, within noise
        self._restore()
        self.final = {
            "restored_epoch": self.best_epoch,
            "best_accuracy": self.best_accuracy,
            "last_epoch": last_epoch,
            "last_accuracy": last,
        }
        why = ""
        if suspect:
            gap, limit = dict(self.gaps)[last_epoch], self.sound_gap()
            why = f" (gap {100 * gap:+.1f} points: above the sound {100 * limit:g})"
        self.echo(
            f"end of training: PGD accuracy on {int(self.y.shape[0])} "
            f"training examples {100 * last:.1f}% after epoch {last_epoch}{why}, "
            f"{100 * self.best_accuracy:.1f}% after epoch {self.best_epoch}: "
            f"kept the epoch {self.best_epoch} weights (keep: best)"
        )
        return self.final

    def keep_margin(self) -> float:
        """How far below the best epoch's PGD accuracy the last epoch may
        end and still be kept: two standard errors of the difference of two
        binomial accuracies on this batch (3.9 points on 256 examples at
        95%); keeping the schedule's end beats choosing by noise."""
        p = min(max(self.best_accuracy, 0.0), 1.0)
        return 2.0 * float(np.sqrt(2.0 * p * (1.0 - p) / self.y.shape[0]))

    def kept_epoch(self) -> Optional[int]:
        """The epoch whose weights the model holds (None before the first)."""
        if self.final is not None:
            return self.final["restored_epoch"]
        if not self.accuracies:
            return None
        last_epoch = self.accuracies[-1][0]
        if self.triggers and self.triggers[-1]["epoch"] == last_epoch:
            return self.triggers[-1]["best_epoch"] or last_epoch
        return last_epoch

    def _verdict(self) -> Optional[dict[str, Any]]:
        limit = self.sound_gap()
        collapsed = [e for e, g in self.gaps if g > limit]
        if not collapsed or any(g <= limit for _, g in self.gaps):
            return None
        gaps = [g for _, g in self.gaps]
        kept = self.kept_epoch()
        pgd = dict(self.accuracies).get(kept)
        message = (
            f"catastrophic overfitting: no epoch the guard could keep was "
            f"sound: in each of the {len(gaps)} epoch(s) trained at full eps "
            f"the training attack's accuracy was {100 * min(gaps):.1f}-"
            f"{100 * max(gaps):.1f} points above PGD-{self.steps}'s "
            f"(sound: at most {100 * limit:g}); the epoch {kept} weights "
            f"(PGD-{self.steps} {100 * pgd:.1f}% on {int(self.y.shape[0])} "
            "training examples) are kept, but are not robust"
        )
        return {
            "collapsed_epochs": collapsed,
            "smallest_gap": min(gaps),
            "largest_gap": max(gaps),
            "kept_epoch": kept,
            "kept_pgd_accuracy": pgd,
            "message": message,
        }

    def state_arrays(self) -> dict[str, np.ndarray]:
        """What it saw and the best epoch's weights, as arrays: one group
        of `advtrain.fit`'s checkpoints (`load_arrays` takes them back)."""
        meta = {
            "format": 1,
            "accuracies": [[e, a] for e, a in self.accuracies],
            "triggers": self.triggers,
            "gaps": [[e, g] for e, g in self.gaps],
            "best_accuracy": self.best_accuracy,
            "best_epoch": self.best_epoch,
        }
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
        best = {"weights": self._best_weights, "slots": self._best_slots}
        for prefix, values in best.items():
            for i, value in enumerate(values or []):
                arrays[f"{prefix}/{i:05d}"] = value
        return arrays

    def save_state(self, path: Union[str, Path]) -> None:
        """Writes `state_arrays` to an `.npz`, atomically (a guard used
        without `advtrain.fit`'s checkpoints)."""
        buffer = io.BytesIO()
        np.savez(buffer, **self.state_arrays())
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(buffer.getvalue())

    def load_state(self, path: Union[str, Path], epochs_done: int) -> bool:
        """`load_arrays` from a `save_state` file; False when unreadable."""
        try:
            with np.load(Path(path), allow_pickle=False) as npz:
                arrays = {key: npz[key] for key in npz.files}
        except (OSError, ValueError):
            return False
        return self.load_arrays(arrays, epochs_done)

    def load_arrays(self, arrays: dict[str, np.ndarray], epochs_done: int) -> bool:
        """Takes back a saved state's first `epochs_done` epochs; False (a
        fresh guard) when it is missing or its best epoch later."""
        try:
            meta = json.loads(arrays["meta"].tobytes().decode())
        except (KeyError, ValueError):
            return False
        files = sorted(arrays)
        weights = [arrays[k] for k in files if k.startswith("weights/")]
        slots = [arrays[k] for k in files if k.startswith("slots/")]
        best_epoch = meta.get("best_epoch")
        if best_epoch is None or best_epoch > epochs_done or not weights:
            return False

        def done(rows):
            return [(int(e), float(value)) for e, value in rows if e <= epochs_done]

        self.accuracies = done(meta["accuracies"])
        self.gaps = done(meta.get("gaps", []))
        self.triggers = [t for t in meta["triggers"] if t["epoch"] <= epochs_done]
        self.best_accuracy = float(meta["best_accuracy"])
        self.best_epoch = int(best_epoch)
        self._best_weights = weights
        self._best_slots = slots
        return True

    def summary(self) -> dict[str, Any]:
        """JSON-ready record of what the guard saw and did."""
        return {
            "pgd_accuracy": [{"epoch": e, "accuracy": a} for e, a in self.accuracies],
            "best_epoch": self.best_epoch,
            "best_accuracy": None if self.best_epoch is None else self.best_accuracy,
            "drop": self.drop,
            "max_gap": self.max_gap,
            "sound_gap": self.sound_gap(),
            "gaps": [{"epoch": e, "gap": g} for e, g in self.gaps],
            "action": self.action,
            "triggers": list(self.triggers),
            "keep": self.keep,
            "final": self.final,
            "unsound": self.unsound,
        }
