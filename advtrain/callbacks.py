"""Training callbacks: progress lines, the NaN guard, and atomic checkpoints."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import keras
import numpy as np


class ProgressLine(keras.callbacks.Callback):
    """One line per epoch: metrics, seconds and samples per second."""

    def __init__(
        self, echo: Callable[[str], None], epochs: int, samples_per_epoch: int
    ):
        super().__init__()
        self.echo = echo
        self.epochs = epochs
        self.samples_per_epoch = samples_per_epoch
        self.epoch_seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        self.epoch_seconds.append(seconds)
        shown = "  ".join(
            f"{k} {v:.4f}" for k, v in (logs or {}).items() if k != "learning_rate"
        )
        rate = self.samples_per_epoch / max(seconds, 1e-9)
        self.echo(
            f"epoch {epoch + 1}/{self.epochs}  {shown}  "
            f"({seconds:.1f} s, {rate:.0f} samples/s)"
        )


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or Inf loss and was stopped (exit code 1)."""


class NaNGuard(keras.callbacks.Callback):
    """Stops training at the first non-finite loss, before anything saves it.

    Replaces `keras.callbacks.TerminateOnNaN`, which lets the epoch end (and
    so every epoch-end callback, checkpoints included) run on NaN weights.
    This guard raises `NonFiniteLossError` from the batch where the loss
    turned non-finite, so `fit` ends there: no checkpoint, model or metrics
    file is written from the bad weights, and the message names the step,
    the last good checkpoint and the usual causes. Put it before the
    checkpoint callback.

    Args:
        steps_per_epoch: batches per epoch, to report a global step.
        hint: the likely causes, e.g. the recipe's learning rate and eps.
        last_good: returns the newest checkpoint on disk (or None).

    Example:

    ```python
    guard = NaNGuard(steps_per_epoch=100, hint="train.learning_rate=1e6")
    model.fit(ds, epochs=3, steps_per_epoch=100, callbacks=[guard, ckpt])
    ```
    """

    def __init__(
        self,
        steps_per_epoch: int,
        hint: str = "",
        last_good: Callable[[], Optional[Path]] = lambda: None,
    ):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.hint = hint
        self.last_good = last_good
        self.step_offset = 0
        self.steps_this_fit = steps_per_epoch
        self._epoch = 0

    def begin_fit(self, step_offset: int, steps: int) -> None:
        """Call before each `fit`: it trains `steps` batches of its first
        epoch, starting after batch `step_offset`."""
        self.step_offset = step_offset
        self.steps_this_fit = steps

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0
        self.steps_this_fit = self.steps_per_epoch

    def on_train_batch_end(self, batch, logs=None):
        value = (logs or {}).get("loss")
        if value is None:
            return
        loss = float(np.asarray(value))
        if math.isfinite(loss):
            return
        self.model.stop_training = True
        # With steps_per_execution > 1, Keras reports the last step of the
        # host call; the loss went bad at or before it.
        step = self.step_offset + min(batch + 1, self.steps_this_fit)
        global_step = self._epoch * self.steps_per_epoch + step
        last = self.last_good()
        kept = f"kept {last}" if last else "no checkpoint was written yet"
        causes = ["learning rate too high", "eps too large"]
        scale = getattr(self.model.optimizer, "dynamic_scale", None)
        if scale is not None:
            causes.append(f"float16 overflow (loss scale {float(np.asarray(scale)):g})")
        hint = f" ({self.hint})" if self.hint else ""
        raise NonFiniteLossError(
            f"loss became {loss} at epoch {self._epoch + 1}, step {step} "
            f"(global step {global_step}); training stopped and nothing was "
            f"saved from it, {kept}. Likely causes: {', '.join(causes)}{hint}."
        )


class AtomicCheckpoint(keras.callbacks.Callback):
    """Checkpoints every N epochs and every M steps, atomically, for resume.

    Each checkpoint (an `advtrain.checkpointing.CheckpointStore` folder)
    holds the model's variables (SeedGenerator state included), the
    optimizer's (iterations, slots, loss scale) and the metrics', plus the
    epoch and step, so `advtrain resume` continues exactly where it was
    written. The newest `keep` are kept, plus the best by the store's
    monitor; an epoch that improves it is checkpointed even off schedule,
    and so is the final epoch.

    Step checkpoints land at the first host call at or after every
    `every_steps`-th step (exactly there when `steps_per_execution` divides
    it), never on an epoch's last step: the epoch checkpoint belongs there.

    Args:
        store: where checkpoints go.
        steps_per_epoch: batches per epoch.
        epochs: the run's total epochs.
        every_epochs: epoch checkpoint period.
        every_steps: step checkpoint period (None: none).
        phase: name of the current fine-tuning phase (recorded).
        global_step: batches already trained (when resuming).

    Example:

    ```python
    store = CheckpointStore(run_dir / "checkpoints", keep=3,
                            monitor="adv_accuracy")
    ckpt = AtomicCheckpoint(store, steps_per_epoch=100, epochs=10)
    model.fit(ds, epochs=10, steps_per_epoch=100, callbacks=[ckpt])
    ```
    """

    def __init__(
        self,
        store,
        *,
        steps_per_epoch: int,
        epochs: int,
        every_epochs: int = 1,
        every_steps: Optional[int] = None,
        phase: str = "train",
        global_step: int = 0,
    ):
        super().__init__()
        self.store = store
        self.steps_per_epoch = steps_per_epoch
        self.epochs = epochs
        self.every_epochs = every_epochs
        self.every_steps = every_steps
        self.phase = phase
        self.last_saved_step = global_step
        self.saved: list[Path] = []
        self.step_offset = 0
        self.steps_this_fit = steps_per_epoch
        self._epoch = 0

    def begin_fit(self, phase: str, step_offset: int, steps: int) -> None:
        """Call before each `fit` (see `NaNGuard.begin_fit`)."""
        self.phase = phase
        self.step_offset = step_offset
        self.steps_this_fit = steps

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_steps:
            return
        done = self.step_offset + min(batch + 1, self.steps_this_fit)
        if done >= self.steps_per_epoch:
            return
        global_step = self._epoch * self.steps_per_epoch + done
        if global_step // self.every_steps <= self.last_saved_step // self.every_steps:
            return
        self.saved.append(
            self.store.save(
                self.model,
                kind="step",
                epoch=self._epoch,
                step=done,
                global_step=global_step,
                phase=self.phase,
                logs=logs,
                steps_per_epoch=self.steps_per_epoch,
            )
        )
        self.last_saved_step = global_step

    def on_epoch_end(self, epoch, logs=None):
        self.step_offset = 0
        self.steps_this_fit = self.steps_per_epoch
        logs = logs or {}
        monitor = self.store.monitor
        value = logs.get(monitor) if monitor else None
        value = None if value is None else float(np.asarray(value))
        improved = self.store.is_improvement(value)
        due = (epoch + 1) % self.every_epochs == 0 or epoch + 1 == self.epochs
        if not (due or improved):
            return
        global_step = (epoch + 1) * self.steps_per_epoch
        path = self.store.save(
            self.model,
            kind="epoch",
            epoch=epoch + 1,
            step=0,
            global_step=global_step,
            phase=self.phase,
            logs=logs,
            prune=False,
            steps_per_epoch=self.steps_per_epoch,
        )
        if improved:
            self.store.record_best(path, value, epoch + 1)
        self.store.prune()
        self.saved.append(path)
        self.last_saved_step = global_step
