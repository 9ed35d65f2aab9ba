"""`TrainingState`: resuming and checkpointing one run folder. Beyond
BackupAndRestore: a resume inside an epoch trains the same batches with the
same running metrics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import keras
import numpy as np

from advtrain.train.callbacks import AtomicCheckpoint, NaNGuard, Preemption
from advtrain.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    extra_group,
    find_resume_point,
    read_history,
    restore_variables,
    truncate_history,
    writable_dir,
)
from advtrain.utils.errors import one_line
from advtrain.utils.io import atomic_write_text
from advtrain.utils.progress import Echo

# The checkpoints' group holding a catastrophic-overfitting guard's state.
GUARD_GROUP = "co_guard"


class TrainingState:
    """Resume and checkpointing of one run folder.

    Creating it installs the preemption signal handlers (SIGTERM/SIGINT:
    checkpoint and exit 75; before training, `Preempted` at once): `fit`
    creates it and restores the caller's handlers when it returns. Then
    `restore`, `open`, `callbacks`, and during training `restore_optimizer`.

    Args:
        run_dir: the run folder.
        resuming: whether `run_dir` holds the run, interrupted.
        workers: workers of the run.
        resume_hint: how to resume, appended to the preemption message.
        echo: receives progress lines and warnings.

    Example:

    ```python
    state = TrainingState(run_dir, resuming=resuming, workers=runtime.workers)
    state.restore(model, steps_per_epoch=plan.steps_per_epoch)
    state.open(is_chief=runtime.is_chief, epochs=plan.epochs)
    callbacks = state.callbacks(model, image_shape)
    ```
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        resuming: bool = False,
        workers: int = 1,
        resume_hint: str = "",
        echo: Echo = print,
    ):
        self.run_dir = Path(run_dir)
        self.echo = echo
        self.resuming = resuming
        self.preemption = Preemption(
            self.run_dir, workers=workers, resume_hint=resume_hint
        )
        self.point: Optional[Checkpoint] = None
        self.steps_per_epoch = 1
        self.out = self.run_dir
        self.guard: Optional[NaNGuard] = None
        self.checkpoint: Optional[AtomicCheckpoint] = None
        self._pending_metrics: Optional[Checkpoint] = None

    @property
    def start_epoch(self) -> int:
        """The epoch training continues with (0-based), after `start_step`
        of its batches."""
        return self.point.epoch if self.point else 0

    @property
    def start_step(self) -> int:
        return self.point.step if self.point else 0

    @property
    def start_global_step(self) -> int:
        return self.start_epoch * self.steps_per_epoch + self.start_step

    def restore(self, model: keras.Model, *, steps_per_epoch: int) -> None:
        """Restores the model's variables from the newest usable checkpoint.

        Raises:
            CheckpointError: it was written for another epoch length or model.
        """
        self.steps_per_epoch = spe = steps_per_epoch
        if not self.resuming:
            return
        point = find_resume_point(self.run_dir / "checkpoints", echo=self.echo)
        if point is None:
            self.echo(f"resuming {self.run_dir}: no usable checkpoint; from epoch 1")
            return
        saved_spe = point.state.get("steps_per_epoch")
        if saved_spe not in (None, spe):
            raise CheckpointError(
                f"{point.path}: written with {saved_spe} steps per "
                f"epoch, the data now gives {spe}; the training data "
                "changed, so the run cannot continue where it stopped"
            )
        restore_variables(model, point, "model")
        self.point = point
        # The interrupted epoch's running metrics continue from the
        # checkpoint's (Keras resets them just before on_epoch_begin).
        self._pending_metrics = point if point.step else None
        same = (
            " (the interrupted epoch's remaining steps are trained "
            "with the same batches)"
        )
        self.echo(
            f"resuming {self.run_dir} from {point.path.name}: epoch "
            f"{point.epoch + 1}, after step {point.step}/{spe}"
            + (same if point.step else "")
        )

    def open(
        self,
        *,
        is_chief: bool,
        epochs: int,
        files: Optional[dict[str, str]] = None,
        keep_checkpoints: int = 3,
        monitor: Optional[str] = None,
        monitor_mode: str = "max",
        checkpoint_every_epochs: int = 1,
        checkpoint_every_steps: Optional[int] = None,
        nan_hint: str = "",
    ) -> Path:
        """Prepares and returns the folder this worker writes (the chief's:
        the run folder), writing `files` (name: text) into it atomically,
        and the checkpoint callbacks."""
        self.out = out = writable_dir(self.run_dir, is_chief)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            atomic_write_text(out / name, text)
        if self.resuming:
            truncate_history(out / "history.csv", self.start_epoch)
        store = CheckpointStore(
            out / "checkpoints", keep_checkpoints, monitor, monitor_mode
        )
        store.remove_temporaries()
        # Step checkpoints read every variable anyway: check them first.
        self.guard = NaNGuard(
            self.steps_per_epoch, nan_hint, store.latest, bool(checkpoint_every_steps)
        )
        self.checkpoint = AtomicCheckpoint(
            store,
            steps_per_epoch=self.steps_per_epoch,
            epochs=epochs,
            every_epochs=checkpoint_every_epochs,
            every_steps=checkpoint_every_steps,
            global_step=self.start_global_step,
        )
        return out

    def callbacks(
        self, model: keras.Model, image_shape, before: Sequence = ()
    ) -> list[keras.callbacks.Callback]:
        """The callbacks in their order: the resumed epoch's metrics,
        `before`, NaN guard, history CSV, checkpoint, preemption. A
        catastrophic-overfitting guard among `before` keeps its state in
        this folder's checkpoints (group `co_guard`), and takes it back
        when resuming."""
        for guard in before:
            if hasattr(guard, "load_state"):
                self._resume_guard(guard)
        start = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda *_: self._restore_epoch_metrics(model, image_shape)
        )
        csv = keras.callbacks.CSVLogger(str(self.out / "history.csv"), append=True)
        return [start, *before, self.guard, csv, self.checkpoint, self.preemption]

    def _resume_guard(self, guard) -> None:
        # One more group of each checkpoint, hashed with the variables.
        self.checkpoint.store.extras[GUARD_GROUP] = guard.state_arrays
        if self.point is None:
            return
        saved = extra_group(self.point, GUARD_GROUP)
        if guard.load_arrays(saved, self.start_epoch):
            self.echo(
                f"catastrophic-overfitting guard: resumed with its record of "
                f"{len(guard.accuracies)} epoch(s), best PGD accuracy "
                f"{100 * guard.best_accuracy:.1f}% (epoch {guard.best_epoch})"
            )

    def restore_optimizer(self, model: keras.Model, phase) -> None:
        """Continues the optimizer of the interrupted phase; a new phase
        starts a fresh one, as an uninterrupted run does."""
        point = self.point
        if (
            point is not None
            and point.phase == phase.name
            and point.global_step > phase.start_epoch * self.steps_per_epoch
        ):
            model.optimizer.build(model.trainable_variables)
            restore_variables(model, point, "optimizer")

    def _restore_epoch_metrics(self, model: keras.Model, image_shape) -> None:
        point, self._pending_metrics = self._pending_metrics, None
        if point is None:
            return
        try:
            # Compiled metrics create their variables on first use; one update
            # on a dummy batch (then reset) creates them before the restore.
            x = np.zeros((1, *image_shape), "float32")
            model.compute_metrics(x, np.zeros((1,), "int32"), model(x))
            model.reset_metrics()
            restore_variables(model, point, "metrics")
        except (ValueError, RuntimeError, TypeError) as exc:
            model.reset_metrics()
            self.echo(
                f"warning: the resumed epoch's logged metrics cover only the "
                f"steps after the resume ({one_line(exc)})"
            )

    def history(self, trained: dict[str, list[float]]) -> dict[str, list[float]]:
        """The whole run's history (from its file when resumed)."""
        if self.resuming:
            return read_history(self.out / "history.csv") or trained
        return trained

    def samples_trained(self, epochs: int, global_batch: int) -> int:
        """Samples this process trained (a resumed run skips the others)."""
        remaining = epochs * self.steps_per_epoch - self.start_global_step
        return global_batch * max(0, remaining)
