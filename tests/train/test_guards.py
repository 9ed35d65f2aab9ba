"""The catastrophic-overfitting guard catches a collapse and acts on it.

Plain FGSM training on 8x8 digits did not overfit catastrophically in our
trials (eps 0.1 to 0.3, steps up to 2.5 * eps, learning rates up to 0.03,
up to 20 epochs: PGD accuracy on the training batch kept rising), so these
tests force the collapse: FGSM training runs normally for two epochs, then
the learning rate jumps to 5.0 and the weights are wrecked within one
epoch. PGD accuracy on the guard batch falls from ~0.5 to chance, which is
what the guard watches for whatever the cause.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml
from helpers import dense_classifier, never_robust_recipe, run_fresh

from advtrain.attacks import Attack
from advtrain.models.adversarial import AdversarialModel
from advtrain.train.guards import (
    COLLAPSED_EXIT_CODE,
    SOUND_GAP,
    CatastrophicOverfittingGuard,
)

EPS = 0.1


def _fgsm_model():
    model = AdversarialModel(
        dense_classifier(), Attack("fgsm", eps=EPS), adv_weight=1.0, seed=0
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class _LearningRateSpike(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.model.optimizer.learning_rate.assign(5.0)


def _train(digits, action, epochs=4, state_path=None):
    x, y = digits
    model = _fgsm_model()
    lines = []
    guard = CatastrophicOverfittingGuard(
        x[:128],
        y[:128],
        eps=EPS,
        steps=3,
        drop=0.2,
        action=action,
        echo=lines.append,
        state_path=state_path,
    )
    history = model.fit(
        x[:768],
        y[:768],
        batch_size=64,
        epochs=epochs,
        verbose=0,
        callbacks=[_LearningRateSpike(epoch=2), guard],
    )
    return model, guard, history.history, lines


@pytest.mark.backend_neutral
def test_rollback_restores_the_best_weights_and_goes_on(digits):
    model, guard, history, lines = _train(digits, "rollback")
    accuracies = [a for _, a in guard.accuracies]
    assert len(history["loss"]) == 4  # training went on after the collapse
    assert guard.best_epoch == 2 and guard.best_accuracy > 0.4
    # Quiet while training goes well, then one trigger per collapsed epoch.
    assert [t["epoch"] for t in guard.triggers] == [3, 4]
    assert all(a < guard.best_accuracy - 0.2 for a in accuracies[2:])
    # The collapsed epochs' weights were replaced by epoch 2's.
    assert guard.robust_accuracy() == pytest.approx(guard.best_accuracy)
    assert history["co_guard_pgd_accuracy"] == pytest.approx(accuracies)
    assert "catastrophic overfitting at epoch 3" in lines[0]
    assert "restored the epoch 2 weights, training goes on" in lines[0]


def test_stop_ends_training_with_the_best_weights(digits):
    model, guard, history, lines = _train(digits, "stop", epochs=6)
    assert len(history["loss"]) == 3
    assert model.stop_training
    assert len(guard.triggers) == 1 and guard.triggers[0]["action"] == "stop"
    assert guard.robust_accuracy() == pytest.approx(guard.best_accuracy)
    assert "stopping training" in lines[0]
    summary = guard.summary()
    assert summary["best_epoch"] == 2
    assert [p["epoch"] for p in summary["pgd_accuracy"]] == [1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"action": "restart"}, "action must be one of stop, rollback"),
        ({"drop": 0.0}, "drop must be in"),
        ({"steps": 0}, "steps: must be an int"),
        ({"keep": "first"}, "keep must be one of best, last"),
        ({"max_gap": 1.5}, "max_gap must be in"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, match):
    x = np.zeros((4, 8, 8, 1), "float32")
    with pytest.raises(ValueError, match=match):
        CatastrophicOverfittingGuard(x, np.zeros(4, int), eps=0.1, **kwargs)


def test_saved_state_lets_a_resumed_run_roll_back(digits, tmp_path):
    path = tmp_path / "checkpoints" / "co_guard.npz"
    model, guard, _, _ = _train(digits, "rollback", state_path=path)
    assert path.is_file() and not list(path.parent.glob(".tmp-*"))

    x, y = digits
    fresh = _fgsm_model()
    fresh.fit(x[:64], y[:64], epochs=1, verbose=0)  # builds the optimizer
    resumed = CatastrophicOverfittingGuard(
        x[:128], y[:128], eps=EPS, steps=3, drop=0.2, echo=lambda _: None
    )
    resumed.set_model(fresh)
    assert resumed.load_state(path, epochs_done=4)
    assert resumed.accuracies == guard.accuracies
    assert resumed.gaps == guard.gaps and len(guard.gaps) == 4
    assert resumed.best_epoch == 2 and [t["epoch"] for t in resumed.triggers] == [3, 4]
    # A collapse after the resume rolls back to the epoch-2 weights that
    # were saved before it.
    resumed.on_epoch_end(4, {})
    assert [t["epoch"] for t in resumed.triggers] == [3, 4, 5]
    for a, b in zip(fresh.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    # Resumed from an earlier checkpoint: later epochs are forgotten.
    early = CatastrophicOverfittingGuard(x[:8], y[:8], eps=EPS)
    assert early.load_state(path, epochs_done=3)
    assert [e for e, _ in early.accuracies] == [1, 2, 3]
    assert [t["epoch"] for t in early.triggers] == [3]
    # Before the best epoch, or no file: a fresh guard.
    assert not CatastrophicOverfittingGuard(x[:8], y[:8], eps=EPS).load_state(
        path, epochs_done=1
    )
    assert not CatastrophicOverfittingGuard(x[:8], y[:8], eps=EPS).load_state(
        tmp_path / "missing.npz", epochs_done=4
    )


def test_keep_best_restores_the_best_epoch_when_training_ends_lower(digits):
    x, y = digits
    model = _fgsm_model()
    lines = []
    # A drop of 0.9 never triggers: the end-of-training choice alone acts.
    guard = CatastrophicOverfittingGuard(
        x[:128], y[:128], eps=EPS, steps=3, drop=0.9, echo=lines.append
    )
    model.fit(
        x[:768],
        y[:768],
        batch_size=64,
        epochs=3,
        verbose=0,
        callbacks=[_LearningRateSpike(epoch=2), guard],
    )
    (_, last), best = guard.accuracies[-1], guard.best_accuracy
    assert guard.triggers == [] and last < best
    assert guard.final["restored_epoch"] == guard.best_epoch == 2
    assert guard.robust_accuracy() == pytest.approx(best)
    assert "kept the epoch 2 weights" in lines[-1]
    assert guard.summary()["final"] == guard.final

    last_guard = CatastrophicOverfittingGuard(
        x[:128], y[:128], eps=EPS, steps=3, drop=0.9, keep="last"
    )
    model = _fgsm_model()
    model.fit(
        x[:768],
        y[:768],
        batch_size=64,
        epochs=3,
        verbose=0,
        callbacks=[_LearningRateSpike(epoch=2), last_guard],
    )
    assert last_guard.final is None
    assert last_guard.robust_accuracy() == pytest.approx(last_guard.accuracies[-1][1])


def test_keep_best_keeps_the_last_epoch_within_the_checks_noise(digits):
    """An end within two standard errors of the best epoch (on this batch)
    is noise, not a fall: the last epoch stays, beyond that the best comes
    back."""
    x, y = digits
    model = _fgsm_model()
    guard = CatastrophicOverfittingGuard(x[:256], y[:256], eps=EPS, steps=1)
    guard.set_model(model)
    guard.best_accuracy, guard.best_epoch = 0.961, 14
    assert guard.keep_margin() == pytest.approx(0.0342, abs=1e-3)
    best = [np.full_like(w, 0.5) for w in model.get_weights()]
    guard._best_weights = best
    guard.accuracies = [(14, 0.961), (15, 0.953)]  # mnist_fast's JAX seed 0
    assert guard.finish() is None and guard.kept_epoch() == 15
    assert not np.allclose(model.get_weights()[0], 0.5)
    guard.accuracies = [(14, 0.961), (15, 0.92)]
    assert guard.finish()["restored_epoch"] == 14
    assert np.allclose(model.get_weights()[0], 0.5)


class _ScriptedGuard(CatastrophicOverfittingGuard):
    """The guard's decisions on scripted (training attack, PGD) accuracies
    per epoch; each epoch's weights are filled with its number."""

    def __init__(self, epochs, **kwargs):
        x = np.zeros((256, 2), "float32")
        super().__init__(x, np.zeros(256, int), eps=0.3, **kwargs)
        self.epochs = epochs
        self._pgd = iter(pgd for _, pgd in epochs)

    def robust_accuracy(self):
        return next(self._pgd)

    def play(self):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        self.set_model(model)
        for epoch, (adv, _) in enumerate(self.epochs):
            model.set_weights([np.full_like(w, epoch + 1) for w in model.get_weights()])
            self.on_epoch_begin(epoch)
            self.on_epoch_end(epoch, {"adv_accuracy": adv})
        self.finish()
        return int(model.get_weights()[0].flat[0])  # the epoch it holds


def test_an_epoch_far_above_the_healthy_gap_is_never_kept_as_sound():
    """Plain FGSM on mnist_fgsm_rs, run 1 of issue 49, in small: epochs under
    the 50-point rollback limit with gaps of +39 to +49 (healthy runs: at
    most +13.2) were kept as the best. Above `SOUND_GAP` they are not, and
    training that ends on one ends on the last sound epoch instead."""
    lines = []
    guard = _ScriptedGuard(
        [(0.50, 0.40), (0.89, 0.43), (0.91, 0.52), (0.92, 0.53)], echo=lines.append
    )
    assert guard.play() == 1
    assert guard.sound_gap() == SOUND_GAP == 0.2
    assert guard.triggers == [] and guard.best_epoch == 1
    assert guard.final["restored_epoch"] == guard.kept_epoch() == 1
    assert "(gap +39.0 points: above the sound 20)" in lines[-1]
    assert guard.unsound is None  # epoch 1 was sound: the guard kept it
    # The healthy runs' largest gap is kept as before.
    assert _ScriptedGuard([(0.80, 0.70), (0.95, 0.818)]).play() == 2


def test_a_run_with_no_epoch_within_the_sound_gap_is_unsound():
    # Gaps of +39 to +46: not one triggers a rollback (limit 50), yet no
    # epoch is sound, so the run is called unsound.
    lines = []
    guard = _ScriptedGuard(
        [(0.89, 0.43), (0.92, 0.53), (0.92, 0.46)], echo=lines.append
    )
    assert guard.play() == 3  # nothing sound to go back to
    assert guard.triggers == [] and guard.best_epoch is None
    assert guard.unsound["collapsed_epochs"] == [1, 2, 3]
    assert "(sound: at most 20)" in guard.unsound["message"]
    assert lines[-1] == guard.unsound["message"]
    # A looser rollback limit does not loosen what counts as sound; a
    # stricter one tightens it.
    assert _ScriptedGuard([(0.9, 0.5)], max_gap=0.8).sound_gap() == 0.2
    assert _ScriptedGuard([(0.9, 0.5)], max_gap=0.1).sound_gap() == 0.1
    assert _ScriptedGuard([(0.9, 0.5)], max_gap=None).sound_gap() is None


def test_one_finite_check_serves_the_nan_guard_and_the_checkpoint():
    from advtrain.train.checkpoint import NonFiniteStateError, capture_variables
    from advtrain.train.guards import first_nonfinite_variable

    inputs = keras.Input((4,))
    bn = keras.layers.BatchNormalization(name="bn")
    model = keras.Model(inputs, keras.layers.Dense(2)(bn(inputs)))
    assert first_nonfinite_variable(model) is None
    capture_variables(model)
    # A non-trainable statistic turns NaN while the loss may stay finite.
    bn.moving_variance.assign(np.full((4,), np.nan, "float32"))
    path = bn.moving_variance.path
    assert first_nonfinite_variable(model) == path
    assert first_nonfinite_variable(model.variables) == path
    with pytest.raises(NonFiniteStateError, match=f"variable {path} holds NaN"):
        capture_variables(model)


# A run that defeats its own attack but was never robust: the model trains
# against FGSM at eps 0.02 (ramped up over its first two epochs) while the
# guard attacks with PGD at eps 0.3. The training attack's accuracy climbs
# with the clean accuracy; PGD's stays near zero from the first epoch, so
# there is no robust best to fall from. The mismatch forces, on a
# few-second run, the signature of a run that collapsed during its eps
# ramp (mnist_fast at eps 0.33: 96-99% against the training attack, 4-34%
# against the guard's PGD-10).
NEVER_ROBUST_STEPS_PER_EPOCH = 12  # 768 images, batch 64


def _never_robust_model() -> AdversarialModel:
    return AdversarialModel(
        dense_classifier(),
        Attack("fgsm", eps=0.02),
        adv_weight=1.0,
        seed=0,
        eps_ramp_steps=2 * NEVER_ROBUST_STEPS_PER_EPOCH,
    )


def _never_robust_run(digits, action, epochs=5):
    x, y = digits
    model = _never_robust_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    lines = []
    guard = CatastrophicOverfittingGuard(
        x[:128], y[:128], eps=0.3, steps=3, action=action, echo=lines.append
    )
    history = model.fit(
        x[:768], y[:768], batch_size=64, epochs=epochs, verbose=0, callbacks=[guard]
    )
    return guard, history.history, lines


@pytest.mark.backend_neutral
def test_a_run_that_was_never_robust_is_caught_and_called_unsound(digits):
    guard, history, lines = _never_robust_run(digits, "rollback")
    # The ramp's epochs are not judged; every later one collapsed.
    assert [(t["epoch"], t["reason"]) for t in guard.triggers] == [
        (3, "gap"),
        (4, "gap"),
        (5, "gap"),
    ]
    assert [e for e, _ in guard.gaps] == [3, 4, 5]
    assert all(g > 0.5 for _, g in guard.gaps)
    assert history["adv_accuracy"][-1] > 0.7
    assert max(a for _, a in guard.accuracies) < 0.2
    # A collapsed epoch never becomes the best: the best is a ramp epoch,
    # restored after each collapse, and the run is called unsound.
    assert guard.best_epoch in (1, 2)
    assert "catastrophic overfitting at epoch 3: the training attack's" in lines[0]
    assert f"restored the epoch {guard.best_epoch} weights" in lines[0]
    unsound = guard.unsound
    assert unsound["collapsed_epochs"] == [3, 4, 5]
    assert unsound["kept_epoch"] == guard.best_epoch
    assert guard.robust_accuracy() == pytest.approx(unsound["kept_pgd_accuracy"])
    assert lines[-1] == unsound["message"]
    assert "no epoch the guard could keep was sound" in lines[-1]
    assert guard.summary()["unsound"] == unsound


def test_stop_ends_a_never_robust_run_at_its_first_judged_epoch(digits):
    guard, history, lines = _never_robust_run(digits, "stop")
    assert len(history["loss"]) == 3
    assert [(t["epoch"], t["action"]) for t in guard.triggers] == [(3, "stop")]
    assert guard.unsound["collapsed_epochs"] == [3]
    assert "stopping training" in lines[0]


def test_a_sound_epoch_means_the_run_is_not_called_unsound(digits):
    # The lr-spike run: sound epochs 1 and 2 (gap checked, under the
    # limit), then collapses caught by the drop from the best epoch.
    _, guard, _, lines = _train(digits, "rollback")
    assert [e for e, _ in guard.gaps] == [1, 2, 3, 4]
    assert all(g <= 0.5 for _, g in guard.gaps)
    assert [t["reason"] for t in guard.triggers] == ["drop", "drop"]
    assert guard.unsound is None
    assert not any("no epoch the guard could keep" in line for line in lines)


@pytest.mark.slow
def test_advtrain_run_says_unsound_in_one_line_report_metrics_and_exit_code(
    tmp_path,
):
    # The same signature through a recipe, in a fresh interpreter.
    recipe = never_robust_recipe()
    path = tmp_path / "never_robust.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    advtrain = Path(sys.executable).parent / "advtrain"
    done = run_fresh([advtrain, "run", path, "-o", out], tmp_path, check=False)
    assert done.returncode == COLLAPSED_EXIT_CODE, done.stdout[-2000:] + done.stderr
    warning = done.stderr.strip().splitlines()[-1]
    assert warning.startswith("warning: catastrophic overfitting: no epoch")
    assert (out / "model.keras").is_file()  # nothing trained is lost
    metrics = json.loads((out / "metrics.json").read_text())
    message = metrics["catastrophic_overfitting"]
    assert warning == f"warning: {message}"
    assert metrics["co_guard"]["unsound"]["collapsed_epochs"] == [1, 2]
    report = (out / "report.md").read_text().splitlines()
    assert report[2].startswith("**Robust accuracy")
    assert report[4] == f"**Warning: {message}.**"


def test_fit_returns_the_guards_verdict(digits):
    from advtrain.train.fitting import fit

    x, y = digits

    def run(callbacks):
        train = {"learning_rate": 1e-2, "seed": 0, "shuffle": False}
        return fit(
            _never_robust_model(),
            (x[:768], y[:768]),
            batch_size=64,
            epochs=5,
            train=train,
            callbacks=callbacks,
            echo=None,
        )

    guard = CatastrophicOverfittingGuard(
        x[:128], y[:128], eps=0.3, steps=3, action="rollback", echo=lambda _: None
    )
    verdict = run([guard]).verdict
    assert verdict["kind"] == "catastrophic_overfitting"
    assert "no epoch the guard could keep was sound" in verdict["reasons"][0]
    assert run([]).verdict is None
