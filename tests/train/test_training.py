"""TrainingState: the one object that resumes a run and checkpoints it."""

import keras
import numpy as np
import pytest

from advtrain.train.callbacks import AtomicCheckpoint, NaNGuard
from advtrain.train.checkpoint import CheckpointError, CheckpointStore
from advtrain.train.training_state import TrainingState


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def _interrupted_run(run_dir, model, *, step=2, steps_per_epoch=6):
    """A run folder as a run killed inside epoch 2 leaves it."""
    run_dir.mkdir()
    (run_dir / "history.csv").write_text("epoch,loss\n0,1.5\n1,1.2\n")
    CheckpointStore(run_dir / "checkpoints").save(
        model,
        kind="step",
        epoch=1,
        step=step,
        global_step=steps_per_epoch + step,
        phase="train",
        steps_per_epoch=steps_per_epoch,
    )


def _open(state, **settings):
    return state.open(is_chief=True, epochs=3, files={"run.txt": "t\n"}, **settings)


def test_a_new_run_starts_at_zero_with_its_callbacks(tmp_path):
    state = TrainingState(tmp_path / "run", echo=lambda line: None)
    try:
        state.restore(_model(), steps_per_epoch=6)
        out = _open(state, checkpoint_every_steps=4)
        assert out == tmp_path / "run"
        assert (out / "run.txt").read_text() == "t\n"  # the caller's record
        assert state.start_epoch == state.start_step == state.start_global_step == 0
        assert state.samples_trained(epochs=3, global_batch=10) == 180
        callbacks = state.callbacks(_model(), (4,), before=["first"])
        assert callbacks[1] == "first" and callbacks[-1] is state.preemption
        assert (
            isinstance(callbacks[2], NaNGuard) and callbacks[2].check_state_every_batch
        )
        assert isinstance(callbacks[4], AtomicCheckpoint)
    finally:
        state.preemption.close()


def test_resume_restores_the_model_and_trims_the_history(tmp_path):
    run_dir = tmp_path / "run"
    saved = _model(seed=0)
    _interrupted_run(run_dir, saved)
    lines = []
    state = TrainingState(run_dir, resuming=True, echo=lines.append)
    try:
        model = _model(seed=1)
        state.restore(model, steps_per_epoch=6)
        for a, b in zip(model.get_weights(), saved.get_weights(), strict=True):
            np.testing.assert_array_equal(a, b)
        start = (state.start_epoch, state.start_step, state.start_global_step)
        assert start == (1, 2, 8)
        assert "epoch 2, after step 2/6" in lines[-1]
        _open(state)
        # Epoch 2 (index 1) is trained again: its row goes.
        assert (run_dir / "history.csv").read_text() == "epoch,loss\n0,1.5\n"
        assert state.checkpoint.last_saved_step == 8
        assert state.samples_trained(epochs=3, global_batch=10) == 100
        # The resumed fit trains the epoch's 4 remaining steps (Keras's
        # params); both callbacks count them after the 2 already trained.
        for callback in (state.guard, state.checkpoint):
            callback.set_params({"steps": 4})
            callback.on_epoch_begin(1)
            assert callback._global_step(callback._done(0)) == 9
    finally:
        state.preemption.close()


def test_resume_refuses_a_checkpoint_of_another_epoch_length(tmp_path):
    run_dir = tmp_path / "run"
    _interrupted_run(run_dir, _model(), steps_per_epoch=6)
    state = TrainingState(run_dir, resuming=True, echo=lambda line: None)
    try:
        with pytest.raises(CheckpointError, match="written with 6 steps per epoch"):
            state.restore(_model(), steps_per_epoch=5)
        assert issubclass(CheckpointError, ValueError)
    finally:
        state.preemption.close()


def test_nan_guard_and_checkpoint_count_steps_alike(tmp_path):
    """One implementation of the step bookkeeping: both callbacks name the
    same global step after a fit that starts inside an epoch."""
    store = CheckpointStore(tmp_path)
    guard = NaNGuard(steps_per_epoch=6)
    checkpoint = AtomicCheckpoint(store, steps_per_epoch=6, epochs=3)
    for callback in (guard, checkpoint):
        callback.set_params({"steps": 4})  # a fit of the last 4 of 6 steps
        callback.on_epoch_begin(1)
        assert callback._done(1) == 4
        assert callback._global_step(callback._done(1)) == 10
        assert callback._done(9) == 6  # never past the fit's last step
