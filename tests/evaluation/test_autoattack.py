"""The AutoAttack-grade evaluation: the cascade, the worst-case headline,
the masking check, and agreement with ART's AutoAttack."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.evaluation.report import robustness_headline
from advtrain.evaluation.robustness import (
    AttackRunner,
    ensemble_attacks,
    evaluate_robustness,
    run_cascade,
    wilson_interval,
)
from advtrain.evaluation.sanity import masking_check, masking_threshold

EPS = 0.1


@pytest.fixture(scope="module")
def cnn(digits_cnn):
    return digits_cnn


@tf.custom_gradient
def _blind_quantize(x):
    """Rounds pixels to 1/4 steps and reports a zero gradient: the
    shattered gradients of Athalye et al. (2018), as a model can learn them."""
    return tf.round(x * 4) / 4, lambda upstream: tf.zeros_like(upstream)


class Masked(keras.Model):
    """`cnn` behind a zero-gradient input quantiser: gradient attacks see
    nothing, a score-only attack still finds the model's weakness."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def call(self, x, training=False):
        return self.inner(_blind_quantize(x), training=training)


def _dataset(x, y, batch=128):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def test_cascade_equals_the_per_example_worst_case(cnn, test_digits):
    # Deterministic attacks (no random start), so running each on every
    # example gives the same verdicts as the cascade's subsets.
    x, y = test_digits
    attacks = {
        "fgsm_small": Attack("fgsm", eps=0.04),
        "pgd": Attack("pgd", eps=0.06, steps=5, random_start=False),
        "fgsm": Attack("fgsm", eps=0.08),
    }
    runner = AttackRunner(cnn, seed=0)
    clean = np.argmax(cnn(x), -1) == y
    result = run_cascade(runner, attacks, x[clean], y[clean], batch_size=64)
    one_by_one = np.ones(int(clean.sum()), bool)
    for attack in attacks.values():
        one_by_one &= runner(attack, x[clean], y[clean]) == y[clean]
    np.testing.assert_array_equal(result["robust"], one_by_one)
    attacked = [s["attacked"] for s in result["steps"]]
    assert attacked[0] == clean.sum() and attacked[1] < attacked[0]  # pruned
    broken = sum(s["broken"] for s in result["steps"])
    assert broken == clean.sum() - one_by_one.sum()


def test_headline_is_the_worst_case_over_autoattack(cnn, test_digits):
    x, y = test_digits
    result = evaluate_robustness(
        cnn, _dataset(x, y), default_eps=EPS, num_classes=10, pgd_steps=10,
        budget="cheap",
    )  # fmt: skip
    steps = result["autoattack"]["steps"]
    assert [s["attack"] for s in steps] == ["apgd_ce", "apgd_t", "square"]
    assert steps[2]["settings"]["queries"] == 1000  # the cheap budget
    assert result["robust_accuracy_over"] == [
        "clean", "fgsm", "pgd", "apgd_ce", "apgd_t", "square",
    ]  # fmt: skip
    robust = result["robust_accuracy"]
    assert robust <= min(result["pgd_accuracy"], result["fgsm_accuracy"])
    assert robust == result["autoattack_square_accuracy"]
    # APGD adds to PGD-10 on this model: the ensemble is stronger.
    assert robust < result["pgd_accuracy"] - 0.01
    # The cascade only attacks what is left.
    assert steps[1]["attacked"] == steps[0]["attacked"] - steps[0]["broken"]
    low, high = result["robust_accuracy_ci95"]
    assert low < robust < high and high - low < 0.12  # 297 examples
    assert "AutoAttack" in result["robust_accuracy_ensemble"]
    label, value = robustness_headline(result)
    assert "worst case" in label and "cheap budget" in label
    assert "95% CI" in value and "297 examples" in value


def test_listed_attacks_only_have_no_ensemble(cnn, test_digits):
    x, y = test_digits
    result = evaluate_robustness(
        cnn, _dataset(x, y), default_eps=EPS, num_classes=10, attacks=["pgd"],
        pgd_steps=5,
    )  # fmt: skip
    assert "autoattack" not in result
    assert result["robust_accuracy_ensemble"] is None
    assert "no AutoAttack" in robustness_headline(result)[0]


def test_masking_check_fires_on_masked_gradients_only(cnn, test_digits):
    x, y = test_digits
    keys = dict(default_eps=EPS, num_classes=10, pgd_steps=10, budget="cheap")
    masked = evaluate_robustness(Masked(cnn), _dataset(x, y), **keys)
    plain = evaluate_robustness(cnn, _dataset(x, y), **keys)
    # Gradient attacks break nothing through the quantiser; Square does.
    assert masked["pgd_accuracy"] > masked["robust_accuracy"] + 0.2
    fired = masking_check(masked)
    assert not fired["passed"] and "gradient masking" in fired["detail"]
    assert masking_check(plain)["passed"]
    assert masking_check({"examples": 10}) is None  # no gradient-free attack


def test_masking_threshold_follows_the_sample_size():
    # Significantly above 0.5% at the 5% level (one-sided binomial).
    assert masking_threshold(200) == 4
    assert masking_threshold(1000) == 10
    assert 0.005 < masking_threshold(10_000) / 10_000 < 0.007


def test_wilson_interval():
    low, high = wilson_interval(850, 1000)
    assert low == pytest.approx(0.827, abs=1e-3)
    assert high == pytest.approx(0.871, abs=1e-3)
    assert wilson_interval(0, 50)[0] == 0.0


def test_ensemble_budgets():
    standard = ensemble_attacks(0.3, "inf", "standard")
    assert standard["apgd_ce"].steps == 100 and standard["square"].queries == 5000
    assert standard["apgd_t"].method == "apgd_dlr"
    assert standard["fab_t"].method == "fab_t"
    assert ensemble_attacks(0.3, budget="cheap")["square"].queries == 1000
    assert ensemble_attacks(0.3, queries=77)["square"].queries == 77
    with pytest.raises(ValueError, match="budget must be one of standard, cheap"):
        ensemble_attacks(0.3, budget="huge")


def test_no_weaker_than_art_autoattack(cnn, test_digits):
    """Our cascade's robust accuracy is at most ART's AutoAttack's (its
    APGD-CE and Square, same iterations and queries) plus a tolerance.

    Both run randomised attacks with their own draws; on these 297 digits
    equal attacks differ by a few examples (tests/attacks: about 2 points),
    so 3 points still catches an ensemble that is clearly weaker."""
    from art.attacks.evasion import (
        AutoAttack,
        AutoProjectedGradientDescent,
        SquareAttack,
    )
    from helpers import art_classifier

    x, y = test_digits
    classifier = art_classifier(cnn)
    members = [
        AutoProjectedGradientDescent(
            classifier, norm=np.inf, eps=EPS, eps_step=2 * EPS, max_iter=100,
            nb_random_init=1, batch_size=len(x), loss_type="cross_entropy",
            verbose=False,
        ),
        SquareAttack(
            classifier, norm=np.inf, eps=EPS, max_iter=1000, p_init=0.8,
            nb_restarts=1, batch_size=len(x), verbose=False,
        ),
    ]  # fmt: skip
    np.random.seed(0)
    art = AutoAttack(classifier, norm=np.inf, eps=EPS, attacks=members)
    x_adv = art.generate(x, y=np.eye(10)[y])
    art_accuracy = float(np.mean(np.argmax(cnn(x_adv), -1) == y))
    ours = evaluate_robustness(
        cnn, _dataset(x, y), default_eps=EPS, num_classes=10,
        attacks="autoattack", budget="cheap",
    )  # fmt: skip
    assert art_accuracy < 0.8, "eps should leave a contest to compare"
    assert ours["robust_accuracy"] <= art_accuracy + 0.03


def test_python_api_evaluate(cnn, test_digits):
    import advtrain

    x, y = test_digits
    result = advtrain.evaluate(
        cnn, (x[:64], y[:64]), eps=EPS, pgd_steps=5, budget="cheap",
        square_queries=50,
    )  # fmt: skip
    assert result["examples"] == 64
    assert result["robust_accuracy"] <= result["pgd_accuracy"] < 1.0
    assert result["autoattack"]["steps"][-1]["settings"]["queries"] == 50


def test_two_classes_run_the_ensemble_without_apgd_t(digits):
    # APGD-T's DLR loss needs 4 logits; a binary classifier still gets
    # APGD-CE, FAB-T (one target: the other class) and Square.
    x, y = digits
    keep = y < 2
    x2, y2 = x[keep][:128], y[keep][:128]
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    result = evaluate_robustness(
        model, _dataset(x2, y2), default_eps=EPS, num_classes=2,
        attacks="autoattack", square_queries=20,
    )  # fmt: skip
    assert [s["attack"] for s in result["autoattack"]["steps"]] == [
        "apgd_ce",
        "fab_t",
        "square",
    ]
    ensemble = result["robust_accuracy_ensemble"]
    assert "AutoAttack (APGD-CE, FAB-T, Square)" in ensemble


def test_fit_reports_the_worst_case_on_test_data(digits):
    from helpers import dense_classifier

    import advtrain

    x, y = digits
    result = advtrain.fit(
        dense_classifier(),
        (x[:512], y[:512]),
        attack=Attack("fgsm", eps=EPS),
        batch_size=64,
        epochs=1,
        echo=None,
    )
    # A run is fit, then evaluate.
    evaluation = advtrain.evaluate(
        result.model.classifier,
        (x[1500:1564], y[1500:1564]),
        eps=EPS,
        budget="cheap",
        square_queries=20,
    )
    assert evaluation["examples"] == 64
    assert evaluation["robust_accuracy"] <= evaluation["pgd_accuracy"]
    assert evaluation["robust_accuracy_ensemble"].startswith("AutoAttack")


def test_the_standard_cascade_runs_fab_t_after_apgd_t():
    standard = ensemble_attacks(0.3, "inf", "standard")
    assert list(standard) == ["apgd_ce", "apgd_t", "fab_t", "square"]
    assert standard["fab_t"].targets == 9 and standard["fab_t"].steps == 100
    assert list(ensemble_attacks(0.3, budget="cheap")) == [
        "apgd_ce", "apgd_t", "square",
    ]  # fmt: skip
    assert "fab_t" not in ensemble_attacks(0.5, "2", "standard")  # L-inf only
