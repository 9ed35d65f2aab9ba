"""Evaluation traces each attack kind once: no tf.function retracing for a
smaller last batch or for other eps / steps / restarts (AttackRunner)."""

import numpy as np
import tensorflow as tf
from helpers import bn_classifier

from advtrain.attacks import Attack
from advtrain.evaluation.robustness import AttackRunner


def test_one_trace_per_attack_kind():
    model = bn_classifier()
    runner = AttackRunner(model, seed=0)
    x = np.random.default_rng(0).random((40, 8, 8, 1)).astype("float32")
    y = np.arange(40) % 10
    attacks = [
        Attack("fgsm", eps=0.1),
        Attack("fgsm", eps=0.3),
        Attack("pgd", eps=0.1, steps=2, restarts=1),
        Attack("pgd", eps=0.2, steps=3, step_size=0.05, restarts=2),
    ]
    for batch in (32, 8):  # a full and a smaller last batch
        for attack in attacks:
            predictions = runner(attack, x[:batch], y[:batch])
            assert predictions.shape == (batch,)
    assert runner.tracing_count == 2  # fgsm, pgd


def test_pgd_hyperparameters_as_tensors_match_python_values():
    model = bn_classifier()
    x = tf.constant(np.random.default_rng(1).random((6, 8, 8, 1)), tf.float32)
    y = tf.constant(np.arange(6) % 10)
    attack = Attack("pgd", eps=0.1, steps=3, restarts=2)
    eager = attack(lambda z: model(z, training=False), x, y, seed=7)
    traced = tf.function(
        lambda steps, restarts: attack.replace(steps=steps, restarts=restarts)(
            lambda z: model(z, training=False), x, y, seed=7
        )
    )(tf.constant(3), tf.constant(2))
    np.testing.assert_allclose(eager.numpy(), traced.numpy(), atol=1e-6)


def test_evaluation_traces_each_attack_kind_once(monkeypatch):
    """Counts traces (not TensorFlow's warning, which needs 5 in 10 calls):
    the AttackRunners an evaluation and the sanity checks create share one
    model's functions and trace each kind exactly once, over batches of 32,
    32 and 6, an eps sweep and the AutoAttack cascade."""
    import advtrain.evaluation.robustness as evaluation
    from advtrain.evaluation.robustness import evaluate_robustness
    from advtrain.evaluation.sanity import run_sanity_checks

    runners = []

    class Recorded(evaluation.AttackRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            runners.append(self)

    monkeypatch.setattr(evaluation, "AttackRunner", Recorded)
    import advtrain.evaluation.sanity as sanity

    monkeypatch.setattr(sanity, "AttackRunner", Recorded)
    model = bn_classifier()
    x = np.random.default_rng(0).random((70, 8, 8, 1)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(70) % 10)).batch(32)
    keys = dict(eps=0.01, pgd_steps=2, pgd_restarts=2, batch_size=32)
    evaluate_robustness(
        model, ds, **keys, eps_sweep=[0.0, 0.005, 0.01], default_eps=0.01,
        num_classes=10, square_queries=20, apgd_steps=2,
    )  # fmt: skip
    run_sanity_checks(model, ds, **keys, default_eps=0.01, max_examples=40)
    assert len(runners) == 3
    assert all(r._functions is runners[0]._functions for r in runners)
    kinds = [key[0] for key in runners[0]._functions]
    methods = sorted(k if isinstance(k, str) else k.method for k in kinds)
    # clean labels, fgsm, pgd; the cascade's apgd_ce, apgd_t, fab_t, square;
    # the sanity checks' variants of fgsm and pgd are the same kinds
    assert methods == [
        "apgd_ce", "apgd_dlr", "fab_t", "fgsm", "pgd", "predict", "square",
    ]  # fmt: skip
    assert runners[0].tracing_count == len(kinds)
