"""Reductions under tf.distribute: replicas agree with one device (two
worker processes under `advtrain launch`: tests/train/test_preemption.py).

Logical CPU devices must be configured before TensorFlow starts, so each
configuration runs in its own process.
"""

import numpy as np
import pytest
from helpers import on_replicas

# Trains a BN-free classifier for 4 steps of a global batch of 32 with three
# training steps (FGSM, fused FGSM, PGD without random start: random starts
# are drawn per replica, so they differ with the replica count) and saves
# weights and epoch metrics.
TRAIN = on_replicas(
    "distributed_train",
    """
    import keras
    import tensorflow as tf
    from advtrain.attacks import Attack
    from advtrain.models.adversarial import AdversarialModel
    from helpers import dense_classifier

    rng = np.random.default_rng(0)
    x = rng.random((128, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 128)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    cases = {
        "fgsm": (Attack("fgsm", eps=0.1), False),
        "fused": (Attack("fgsm", eps=0.1), True),
        "pgd": (Attack("pgd", eps=0.1, steps=2, random_start=False), False),
    }
    arrays = {}
    for name, (attack, fused) in cases.items():
        with runtime.strategy.scope():
            classifier = dense_classifier(seed=0)
            model = AdversarialModel(classifier, attack, 0.5, seed=0,
                                     reuse_gradient=fused)
            model.compile(
                optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
                metrics=["accuracy"],
            )
        history = model.fit(ds, epochs=1, verbose=0, shuffle=False).history
        for i, w in enumerate(classifier.get_weights()):
            arrays[f"{name}/w{i}"] = w
        for key, values in history.items():
            arrays[f"{name}/metric/{key}"] = np.array(values[-1])
    np.savez(out, **arrays)
""",
)


@pytest.mark.replicas(TRAIN)
def test_two_cpu_replicas_match_one_replica(replica_runs):
    arrays = replica_runs(TRAIN)
    one, two = arrays[1], arrays[2]
    assert sorted(one.files) == sorted(two.files)
    weights = [k for k in one.files if "/w" in k]
    metrics = [k for k in one.files if "/metric/" in k]
    assert len(weights) == 12 and metrics
    for key in weights:
        np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)
    # Epoch metrics aggregate over replicas: the same as on one device.
    for key in metrics:
        np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)


# The training stream of `advtrain run` under two logical replicas: each
# step's per-replica batches together hold the examples one device's global
# batch holds, and resuming after k steps skips exactly k steps.
STREAM = on_replicas(
    "run_stream",
    """
    from advtrain.train.runtime import plan_batches
    import tensorflow as tf
    from advtrain.data import load_splits
    from advtrain.recipe.run import train_stream

    data = {"source": "digits", "deterministic": True}
    splits = load_splits("digits", limit_train=96)
    plan = plan_batches(runtime, splits.train_size, batch_size=16)
    one_device = tf.distribute.get_strategy()  # the default strategy

    def steps(strategy, skip, n):
        it = iter(train_stream(splits, data, plan, 0, skip, strategy))
        out = []
        for _ in range(n):
            x, y = next(it)
            if strategy is not one_device:
                parts = runtime.strategy.experimental_local_results(x)
                assert [int(p.shape[0]) for p in parts] == [8, 8]
                x = tf.concat(parts, 0)
            out.append(sorted(np.round(x.numpy().sum(axis=(1, 2, 3)), 4)))
        return out

    single = steps(one_device, 0, 4)
    assert steps(runtime.strategy, 0, 4) == single
    assert steps(runtime.strategy, 3, 1) == single[3:]
    np.savez(out, checked=True)
""",
    replicas=(2,),
)


@pytest.mark.replicas(STREAM)
def test_run_stream_splits_each_global_batch_across_replicas(replica_runs):
    # The script's own assertions ran; an error there fails this test.
    assert bool(replica_runs(STREAM)[2]["checked"])
