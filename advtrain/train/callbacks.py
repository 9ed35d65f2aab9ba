"""Training callbacks: progress lines, the NaN guard, atomic checkpoints,
preemption. Beyond Keras's TerminateOnNaN, ModelCheckpoint and
BackupAndRestore: a NaN stop before anything saves the bad weights, step
checkpoints a run resumes from mid-epoch, SIGTERM -> checkpoint -> exit 75
on every worker."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import keras
import numpy as np

from advtrain import backend as backends
from advtrain.train.preemption import Preempted
from advtrain.utils.progress import Echo


class ProgressLine(keras.callbacks.Callback):
    """One line per epoch: metrics, seconds and samples per second."""

    def __init__(self, echo: Echo, epochs: int, samples_per_epoch: int):
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

    exit_code = 1


class StepCallback(keras.callbacks.Callback):
    """Base of the callbacks that name a step (epoch, batches of it trained,
    global step). A resumed run fits its interrupted epoch alone, so the
    batches before that `fit` are `steps_per_epoch - params["steps"]`."""

    def __init__(self, steps_per_epoch: int):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0
        self._before = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        steps = (self.params or {}).get("steps") or self.steps_per_epoch
        self._before = max(0, self.steps_per_epoch - steps)

    def _done(self, batch: int) -> int:
        # With steps_per_execution > 1, Keras reports a host call's last step.
        return min(self._before + batch + 1, self.steps_per_epoch)

    def _global_step(self, done: int) -> int:
        return self._epoch * self.steps_per_epoch + done


class NaNGuard(StepCallback):
    """Stops training at the first non-finite loss, before anything saves it.

    Unlike `keras.callbacks.TerminateOnNaN`, which lets the epoch-end
    callbacks run on NaN weights, it raises `NonFiniteLossError` from the
    batch itself. The model's state (which can turn NaN while the loss
    stays finite) is checked at every epoch end too, and with
    `check_state_every_batch` after every host call. Put it before the CSV
    logger and the checkpoint.

    Args:
        steps_per_epoch: batches per epoch, to report a global step.
        hint: the likely causes, e.g. the run's learning rate and eps.
        last_good: returns the newest checkpoint on disk (or None).
        check_state_every_batch: check the state after every host call.

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
        check_state_every_batch: bool = False,
    ):
        super().__init__(steps_per_epoch)
        self.hint = hint
        self.last_good = last_good
        self.check_state_every_batch = check_state_every_batch

    def on_epoch_end(self, epoch, logs=None):
        self._check_state(self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        value = (logs or {}).get("loss")
        if value is not None:
            loss = float(np.asarray(value))
            if not math.isfinite(loss):
                self._stop(f"loss became {loss}", batch)
        if self.check_state_every_batch:
            self._check_state(batch)

    def _check_state(self, batch: int) -> None:
        from advtrain.train.guards import first_nonfinite_variable

        name = first_nonfinite_variable(self.model)
        if name is not None:
            self._stop(f"model state became NaN or Inf ({name})", batch)

    def _stop(self, what: str, batch: int) -> None:
        self.model.stop_training = True
        # The loss went bad at or before the host call's last step.
        step = self._done(batch)
        last = self.last_good()
        kept = f"kept {last}" if last else "no checkpoint was written yet"
        causes = ["learning rate too high", "eps too large"]
        scale = getattr(self.model.optimizer, "dynamic_scale", None)
        if scale is not None:
            causes.append(f"float16 overflow (loss scale {float(np.asarray(scale)):g})")
        hint = f" ({self.hint})" if self.hint else ""
        raise NonFiniteLossError(
            f"{what} at epoch {self._epoch + 1}, step {step} (global step "
            f"{self._global_step(step)}); training stopped and nothing was "
            f"saved from it, {kept}. Likely causes: {', '.join(causes)}{hint}."
        )


class AtomicCheckpoint(StepCallback):
    """Checkpoints every N epochs and every M steps, atomically, for resume.

    Each checkpoint (`advtrain.train.checkpoint.CheckpointStore`) holds the
    model's, optimizer's and metrics' variables plus the epoch and step,
    so a resumed run continues exactly where it was written. The final
    epoch and an epoch that improves the store's monitor are checkpointed
    even off schedule. Step checkpoints land at the first host call at or
    after every `every_steps`-th step, never on an epoch's last step.

    Args:
        store: a `CheckpointStore`.
        steps_per_epoch, epochs: batches per epoch, the run's epochs.
        every_epochs, every_steps: the checkpoint periods (steps: None).
        phase: the current fine-tuning phase (recorded).
        global_step: batches already trained (when resuming).

    Example:

    ```python
    store = CheckpointStore(run_dir / "checkpoints", monitor="adv_accuracy")
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
        super().__init__(steps_per_epoch)
        self.store = store
        self.epochs = epochs
        self.every_epochs = every_epochs
        self.every_steps = every_steps
        self.phase = phase
        self.last_saved_step = global_step
        self.saved: list[Path] = []

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_steps:
            return
        done = self._done(batch)
        if done >= self.steps_per_epoch:
            return
        global_step = self._global_step(done)
        if global_step // self.every_steps <= self.last_saved_step // self.every_steps:
            return
        self._save(self._epoch, done, logs)

    def _save(self, epoch: int, done: int, logs) -> Path:
        # done=0: the end of the epoch before `epoch`, an epoch checkpoint.
        global_step = self._global_step(done) if done else epoch * self.steps_per_epoch
        if self.saved and self.last_saved_step == global_step:
            return self.saved[-1]  # preemption right after a checkpoint
        path = self.store.save(
            self.model,
            kind="step" if done else "epoch",
            epoch=epoch,
            step=done,
            global_step=global_step,
            phase=self.phase,
            logs=logs,
            prune=bool(done),
            steps_per_epoch=self.steps_per_epoch,
        )
        self.saved.append(path)
        self.last_saved_step = global_step
        return path

    def save_step_now(self, batch: int, logs=None) -> Optional[Path]:
        """Checkpoints the step reached after host call `batch` now; None
        on an epoch's last step (`save_epoch_now` at the epoch's end)."""
        done = self._done(batch)
        if done >= self.steps_per_epoch:
            return None
        return self._save(self._epoch, done, logs)

    def save_epoch_now(self, epoch: int, logs=None) -> Path:
        """Checkpoints the end of `epoch` unless just done; returns it."""
        path = self._save(epoch + 1, 0, logs or {})
        self.store.prune()
        return path

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        monitor = self.store.monitor
        value = logs.get(monitor) if monitor else None
        value = None if value is None else float(np.asarray(value))
        improved = self.store.is_improvement(value)
        due = (epoch + 1) % self.every_epochs == 0 or epoch + 1 == self.epochs
        if not (due or improved):
            return
        path = self._save(epoch + 1, 0, logs)
        if improved:
            self.store.record_best(path, value, epoch + 1)
        self.store.prune()


# How long workers may take to agree on a step after a signal. TensorFlow's
# handler does nothing on GCE CPU VMs, and cannot agree with a dead peer;
# then the run stops without a new checkpoint rather than train on.
_AGREEMENT_TIMEOUT_SECONDS = 15.0


class Preemption(keras.callbacks.Callback):
    """Turns SIGTERM and SIGINT into a checkpoint and a clean exit.

    Creating it installs the signal handlers (main thread only); `close`
    restores the previous ones. Between `arm` and `disarm` (the training
    loop) a signal asks the next step boundary to checkpoint and raise
    `Preempted` (a step ending an epoch: at the epoch's end, after
    validation and the log row); at other times, or a second time, it
    raises at once. Under MultiWorkerMirroredStrategy TensorFlow's handler
    makes every worker stop at the same step (or the collectives hang).

    Args:
        run_dir: the run folder.
        workers: workers of the run.
        resume_hint: how to resume, ending the message.

    Example:

    ```python
    preemption = Preemption(run_dir)
    preemption.arm(atomic_checkpoint, strategy)
    model.fit(ds, epochs=3, callbacks=[atomic_checkpoint, preemption])
    preemption.disarm()
    preemption.close()
    ```
    """

    def __init__(self, run_dir: Path, *, workers: int = 1, resume_hint: str = ""):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.workers = workers
        self.resume_hint = resume_hint
        self.received: Optional[str] = None
        self._requested = threading.Event()
        self._requested_at = 0.0
        self._batch_end = time.monotonic()
        self._armed = False
        self._agreed = False
        self._at_epoch_end = False
        self._checkpoint = None
        self._handler = None
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame):
        name = signal.Signals(signum).name
        if self._armed and not self._requested.is_set():
            self.received = name
            self._requested_at = time.monotonic()
            self._requested.set()
            return
        self.received = self.received or name
        raise self._preempted(self._latest(), "", written=False)

    def close(self) -> None:
        """Restores the signal handlers found at creation."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self._handler = None

    def arm(self, checkpoint, strategy=None) -> None:
        """Enters training: a signal now stops after the current step,
        checkpointed by `checkpoint` (an `AtomicCheckpoint`); under
        MultiWorkerMirroredStrategy TensorFlow's handler picks the step, over
        several JAX processes a collective after each host call."""
        self._checkpoint = checkpoint
        resolver = getattr(strategy, "cluster_resolver", None)
        if resolver is not None and resolver.cluster_spec().jobs:
            self._handler = self._tf_handler(resolver)
        self._armed = True
        if self._requested.is_set():
            raise self._preempted(self._latest(), "", written=False)

    def disarm(self) -> None:
        """Leaves training; raises `Preempted` if a signal came in the
        last steps (the final epoch's checkpoint holds the state)."""
        self._armed = False
        self._handler = None  # stops TensorFlow's watcher threads
        if self._requested.is_set():
            raise self._preempted(self._latest(), " at the end of training")

    def _tf_handler(self, resolver):
        import shutil
        import tempfile

        import tensorflow as tf

        def agreed():
            self._agreed = True

        # The handler requires a checkpoint (it adds its step counter and
        # restores it at start); `save_fn` writes ours, so this one is empty.
        scratch = tempfile.mkdtemp(prefix="advtrain-preemption-")
        manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(), directory=scratch, max_to_keep=1
        )
        config = tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=self._requested.is_set,
            exit_fn=lambda: None,
            grace_period=0,
            save_fn=agreed,
        )
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver, manager, termination_config=config
        )
        # Read once (empty) when the handler starts; `save_fn` never writes it.
        shutil.rmtree(scratch, ignore_errors=True)
        return handler

    def on_train_batch_end(self, batch, logs=None):
        if not self._armed:
            return
        if self._handler:
            agreed = self._cluster_agreed()
        elif self.workers > 1:  # the processes agree in a collective (JAX)
            agreed = backends.any_process(self._requested.is_set())
        else:
            agreed = self._requested.is_set()
        if not agreed or self._at_epoch_end:
            return
        path = self._checkpoint.save_step_now(batch, logs)
        if path is None:  # the epoch's last step: see on_epoch_end
            self._at_epoch_end = True
            return
        raise self._preempted(path, during=" after the current step")

    def _cluster_agreed(self) -> bool:
        self._handler.save_checkpoint_if_preempted()
        now = time.monotonic()
        step_seconds, self._batch_end = now - self._batch_end, now
        if self._agreed or not self._requested.is_set():
            return self._agreed
        # Agreeing takes two steps at most (the one running, the next).
        limit = max(_AGREEMENT_TIMEOUT_SECONDS, 4 * step_seconds)
        if now - self._requested_at > limit:
            during = f" (the workers agreed on no step in {limit:.0f} s)"
            raise self._preempted(self._latest(), during, written=False)
        return False

    def on_epoch_end(self, epoch, logs=None):
        if not self._at_epoch_end:
            return
        path = self._checkpoint.save_epoch_now(epoch, logs)
        raise self._preempted(path, during=" at the end of the epoch")

    def _latest(self) -> Optional[Path]:
        if self._checkpoint is not None:
            return self._checkpoint.store.latest()
        from advtrain.train.checkpoint import CheckpointStore

        return CheckpointStore(self.run_dir / "checkpoints").latest()

    def _preempted(self, checkpoint: Optional[Path], during: str, written=True):
        self._armed = False
        if checkpoint is None:
            kept = "no checkpoint was written yet"
        elif written:
            kept = f"checkpoint {checkpoint.name} written"
        else:
            kept = f"the last checkpoint, {checkpoint.name}, is kept"
        scratch = None
        store = getattr(self._checkpoint, "store", None)
        if store is not None and self.run_dir not in store.directory.parents:
            scratch = store.directory.parent  # a non-chief worker's folder
        hint = f"; {self.resume_hint}" if self.resume_hint else ""
        message = f"preempted by {self.received or 'a signal'}{during}: {kept}{hint}"
        return Preempted(
            message, checkpoint, multi_worker=self.workers > 1, scratch=scratch
        )
