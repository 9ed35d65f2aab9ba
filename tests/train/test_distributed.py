"""Reductions under tf.distribute: replicas and workers agree with one device.

Logical CPU devices must be configured before TensorFlow starts, so each
configuration runs in its own process.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import on_replicas
from typer.testing import CliRunner

from advtrain.cli.commands import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

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


@pytest.mark.slow
@pytest.mark.launch
def test_launch_two_workers_identical_weights_only_chief_writes(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-mw",
                "data": {"source": "digits", "limit_train": 256, "limit_test": 32},
                "model": {"width": 4},
                "attack": {"method": "fgsm_rs", "eps": 0.1},
                "train": {"epochs": 1, "batch_size": 64},
                "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
                "output": {
                    "tensorboard": False,
                    "plots": False,
                    "export_saved_model": False,
                },
            }
        )
    )
    out = tmp_path / "run"
    old_cwd = os.getcwd()
    os.chdir(ROOT)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT)
    try:
        result = runner.invoke(
            app, ["launch", "--workers", "2", str(recipe), "--output", str(out)]
        )
    finally:
        os.chdir(old_cwd)
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    text = result.output
    assert result.exit_code == 0, text[-4000:]
    assert "worker 0 (chief): exit code 0" in text
    assert "worker 1 (worker): exit code 0" in text
    assert "multi_worker strategy on cpu, 2 replica(s) (2 workers" in text
    assert (
        "batch: global 64 = 2 replica(s) x 32, 32 from each of 2 worker "
        "processes; 4 steps/epoch x 1 epochs"
    ) in text
    assert "final weights identical on all workers (BatchNorm" in text
    assert "workers 1-1 wrote only to temporary folders, now removed" in text
    for name in ("recipe.yaml", "model.keras", "metrics.json", "history.csv"):
        assert (out / name).is_file(), name
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["runtime"]["strategy"] == "multi_worker"


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
