"""The training stage: its phases, resumed where a checkpoint left off.

Beyond `Model.fit` with BackupAndRestore: phases, and a resume inside an
epoch that trains the same batches with the same running metrics.

`fit_phases` is the one phase loop (head-only warm-up, then fine-tuning)
of `advtrain.fit` and of a recipe's run. `TrainingState` owns resuming and
checkpointing a folder: it finds the checkpoint to resume from, restores
the model, optimizer and running metrics from it, trims the history file,
and provides the callbacks that write checkpoints (`AtomicCheckpoint`),
stop on NaN (`NaNGuard`) and turn SIGTERM/SIGINT into a checkpoint
(`Preemption`).

Example:

```python
state = TrainingState(run_dir, resuming=resuming, workers=runtime.workers)
state.restore(model, steps_per_epoch=plan.steps_per_epoch)
state.open(is_chief=runtime.is_chief, epochs=plan.epochs)
history, seconds = fit_phases(model, stream, runtime=runtime, plan=plan,
                              phases=phases, loss=loss, state=state,
                              callbacks=state.callbacks())
```
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import keras

from advtrain.train.callbacks import AtomicCheckpoint, NaNGuard, Preemption
from advtrain.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    find_resume_point,
    read_history,
    restore_variables,
    truncate_history,
    writable_dir,
)
from advtrain.utils.errors import one_line
from advtrain.utils.io import atomic_write_text
from advtrain.utils.progress import Echo


class TrainingState:
    """Resume and checkpointing of one run folder.

    Creating it installs the preemption signal handlers (a signal before
    training raises `Preempted` at once). Then `restore` (resume point,
    model variables), `open` (the folder this worker writes, the checkpoint
    store and callbacks), and during training `restore_optimizer` and
    `restore_epoch_metrics`.

    Args:
        run_dir: the run folder.
        resuming: whether `run_dir` holds the run, interrupted (the caller
            knows its folder's rules).
        workers: workers of the run.
        resume_hint: how to resume, appended to the preemption message.
        echo: receives progress lines and warnings.
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
        # SIGTERM/SIGINT: checkpoint and exit 75 (advtrain.train.preemption).
        self.preemption = Preemption(
            self.run_dir, workers=workers, resume_hint=resume_hint
        )
        self.point: Optional[Checkpoint] = None
        self.steps_per_epoch = 1
        self.out = self.run_dir
        self.guard: Optional[NaNGuard] = None
        self.checkpoint: Optional[AtomicCheckpoint] = None
        self._pending_metrics: list[Checkpoint] = []

    @property
    def start_epoch(self) -> int:
        """The epoch training continues with (0-based)."""
        return self.point.epoch if self.point else 0

    @property
    def start_step(self) -> int:
        """Batches of `start_epoch` trained before the interruption."""
        return self.point.step if self.point else 0

    @property
    def start_global_step(self) -> int:
        return self.start_epoch * self.steps_per_epoch + self.start_step

    def restore(self, model: keras.Model, *, steps_per_epoch: int) -> None:
        """Finds the newest usable checkpoint and restores the model's
        variables from it (nothing for a new run).

        Raises:
            CheckpointError: the checkpoint was written with another number
                of steps per epoch, or for another model.
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
        self._pending_metrics = [point] if point.step else []
        self.echo(
            f"resuming {self.run_dir} from {point.path.name}: epoch "
            f"{point.epoch + 1}, after step {point.step}/{spe}"
            + (
                " (the interrupted epoch's remaining steps are trained "
                "with the same batches)"
                if point.step
                else ""
            )
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
        """Prepares the folder this worker writes (the run folder for the
        chief, a private one for the others) and the checkpoint callbacks;
        returns the folder. `files` (name: text) are written first, each
        atomically: the caller's record of what the folder holds."""
        self.out = out = writable_dir(self.run_dir, is_chief)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            atomic_write_text(out / name, text)
        if self.resuming:
            truncate_history(out / "history.csv", self.start_epoch)
        store = CheckpointStore(
            out / "checkpoints",
            keep=keep_checkpoints,
            monitor=monitor,
            mode=monitor_mode,
        )
        store.remove_temporaries()
        self.guard = NaNGuard(
            self.steps_per_epoch,
            hint=nan_hint,
            last_good=store.latest,
            # Step checkpoints read every variable anyway: check them first.
            check_state_every_batch=bool(checkpoint_every_steps),
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
        self, before: Sequence[keras.callbacks.Callback] = (), after=()
    ) -> list[keras.callbacks.Callback]:
        """`before`, the NaN guard, the history CSV, the checkpoint,
        `after`, and last the preemption callback (it may checkpoint the
        epoch's end)."""
        csv = keras.callbacks.CSVLogger(str(self.out / "history.csv"), append=True)
        return [
            *before,
            self.guard,
            csv,
            self.checkpoint,
            *after,
            self.preemption,
        ]

    def epoch_start(self, model: keras.Model, *, image_shape):
        """A callback that continues an interrupted epoch's running
        metrics at its start."""

        def on_epoch_begin(epoch, logs=None):
            self.restore_epoch_metrics(model, image_shape)

        return keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin)

    def restore_optimizer(self, model: keras.Model, phase) -> None:
        """Continues the optimizer of the interrupted phase (slots,
        iterations and so the learning-rate schedule, loss scale); a new
        phase starts a fresh one, as an uninterrupted run does."""
        point = self.point
        if (
            point is not None
            and point.phase == phase.name
            and point.global_step > phase.start_epoch * self.steps_per_epoch
        ):
            model.optimizer.build(model.trainable_variables)
            restore_variables(model, point, "optimizer")

    def restore_epoch_metrics(self, model: keras.Model, image_shape) -> None:
        """At the interrupted epoch's start: continues its running metrics."""
        if not self._pending_metrics:
            return
        import numpy as np

        point = self._pending_metrics.pop()
        try:
            # Compiled metrics create their variables on first use; one update
            # on a dummy batch (then reset) creates them before the restore.
            x = np.zeros((1, *image_shape), "float32")
            model.compute_metrics(x, np.zeros((1,), "int32"), model(x))
            model.reset_metrics()
            restore_variables(model, point, "metrics")
        except (ValueError, RuntimeError) as exc:
            model.reset_metrics()
            self.echo(
                f"warning: the resumed epoch's logged metrics cover only the "
                f"steps after the resume ({one_line(exc)})"
            )

    def history(self, trained: dict[str, list[float]]) -> dict[str, list[float]]:
        """The whole run's history: `trained` (this process's fits), or the
        history file when the run was resumed."""
        if self.resuming:
            return read_history(self.out / "history.csv") or trained
        return trained

    def samples_trained(self, epochs: int, global_batch: int) -> int:
        """Samples this process trained (a resumed run skips the others)."""
        remaining = epochs * self.steps_per_epoch - self.start_global_step
        return global_batch * max(0, remaining)


def train_stream(splits, data: dict[str, Any], plan, seed: int, skip: int, strategy):
    """A fresh training stream for one `fit`, with its first `skip` steps
    dropped.

    Built after resetting the global seed, so its order depends on the
    recipe alone; reusing one dataset would not do: each new iterator of a
    dataset that reshuffles draws a new order, which a resumed process
    cannot reproduce. Skipping costs input-pipeline work, no model work.

    With several replicas each input pipeline (one per worker) builds its
    own shard, batched per replica (`make_distributed_input`): a worker
    decodes and augments only the examples its replicas train on, instead
    of the whole stream with Keras's rebatching; on one worker the replicas
    of a step together see the same examples as one device would.
    `strategy` None (`Runtime.input_strategy`): whole global batches.
    """
    from advtrain.data import make_distributed_input, make_input

    keras.utils.set_random_seed(seed)
    if strategy is None or strategy.num_replicas_in_sync == 1:
        ds = make_input(
            splits.fresh_train(), batch_size=plan.global_batch, training=True, **data
        ).repeat()
        return ds.skip(skip) if skip else ds

    return make_distributed_input(
        splits.fresh_train,
        strategy,
        global_batch=plan.global_batch,
        training=True,
        repeat=True,
        skip_steps=skip,
        **data,
    )


def compile_model(
    model: keras.Model, *, optimizer, loss, metrics, plan, runtime
) -> None:
    """Compiles the training model for one phase, as `advtrain.fit` and a
    recipe's run both do (call it in the strategy's scope)."""
    model.compile(
        optimizer=optimizer,
        loss=loss,
        metrics=metrics,
        steps_per_execution=plan.steps_per_execution,
        jit_compile=runtime.jit_compile,
    )
    runtime.prepare_model(model)


def phase_optimizer(optimizer, plan, phase, options: dict[str, Any]):
    """A fresh optimizer for `phase` (its learning-rate factor applied) when
    `optimizer` is a name; an optimizer object is used as it is, which one
    phase at the plan's rate allows."""
    from advtrain.train.runtime import make_optimizer

    if isinstance(optimizer, str):
        rate = plan.learning_rate * phase.lr_factor
        phase_plan = dataclasses.replace(plan, learning_rate=rate)
        return make_optimizer(phase_plan, optimizer=optimizer, **options)
    if phase.lr_factor != 1.0 or phase.name != "train":
        raise ValueError(
            "Phases with their own learning rates need the optimizer by name "
            "(each phase starts a fresh one). Received: "
            f"optimizer={type(optimizer).__name__}, phase={phase.name}"
        )
    return optimizer


# fmt: off
def fit_phases(
    model: keras.Model, stream: Callable[[int], Any], *,
    runtime, plan, phases: Sequence, loss, metrics=None,
    optimizer: Any = "adam", optimizer_options: Optional[dict] = None,
    seed: int = 0, callbacks: Sequence[keras.callbacks.Callback] = (),
    state: Optional[TrainingState] = None,
    freeze: Optional[keras.Model] = None, validation_data=None,
    verbose: Any = 0, echo: Echo = print,
) -> tuple[dict[str, list[float]], float]:
    # fmt: on
    """The one phase loop of `advtrain.fit` and a recipe's run: fits the
    phases (from where `state` resumes, when given); returns this process's
    history and its training seconds.

    Args:
        model: the training model (built in `runtime`'s strategy scope).
        stream: `stream(skip)` is the training stream of global batches
            from the run's start, with the first `skip` dropped (each fit
            continues where the last one stopped, a resumed one too).
        runtime: `advtrain.train.runtime.Runtime`.
        plan: `advtrain.train.runtime.BatchPlan`.
        phases: `advtrain.models.freezing.Phase`s, in order.
        loss: the compiled loss.
        metrics: the compiled metrics.
        optimizer: a name ("adam", "sgd", "adamw": each phase a fresh one,
            its rate x the phase's factor) or an optimizer (one phase).
        optimizer_options: `make_optimizer`'s other keywords.
        seed: epoch e's host-side randomness is seed + e.
        callbacks: passed to `Model.fit`.
        state: the run folder's `TrainingState` (opened), or None.
        freeze: the model whose backbone the phases freeze (None: the
            model trains whole).
        validation_data: batches validated after each epoch, or None.
        verbose: Keras progress bar level.
        echo: receives a line per phase (when there are several).
    """
    from advtrain.models.freezing import apply_phase

    spe, start = plan.steps_per_epoch, time.perf_counter()
    start_epoch = state.start_epoch if state else 0
    seeding = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs=None: keras.utils.set_random_seed(
            seed + epoch
        )
    )
    history: dict[str, list[float]] = {}
    if state:
        state.preemption.arm(state.checkpoint, runtime.strategy)
    for phase in phases:
        if phase.epochs <= 0:
            continue
        trainable = apply_phase(freeze, phase) if freeze is not None else []
        if phase.end_epoch <= start_epoch:
            continue  # done before the interruption
        if phase.name != "train":
            echo(
                f"phase {phase.name}: epochs {phase.start_epoch + 1}-"
                f"{phase.end_epoch}, freeze={phase.freeze}, "
                f"{len(trainable)} backbone layer(s) trainable, "
                f"lr x{phase.lr_factor:g}"
            )
        with runtime.scope():
            compile_model(
                model,
                optimizer=phase_optimizer(
                    optimizer, plan, phase, optimizer_options or {}
                ),
                loss=loss,
                metrics=metrics,
                plan=plan,
                runtime=runtime,
            )
            if state:
                state.restore_optimizer(model, phase)
                state.checkpoint.phase = phase.name
        epoch = max(phase.start_epoch, start_epoch)
        step = state.start_step if state and epoch == start_epoch else 0
        while epoch < phase.end_epoch:
            # An interrupted epoch is fitted alone, for its remaining steps.
            end = epoch + 1 if step else phase.end_epoch
            result = model.fit(
                stream(epoch * spe + step),
                initial_epoch=epoch,
                epochs=end,
                steps_per_epoch=spe - step,
                validation_data=validation_data,
                callbacks=[seeding, *callbacks],
                verbose=verbose,
                shuffle=False,  # the tf.data pipeline shuffles
            )
            for key, values in result.history.items():
                history.setdefault(key, []).extend(values)
            epoch, step = end, 0
    if state:
        state.preemption.disarm()
    return history, time.perf_counter() - start
