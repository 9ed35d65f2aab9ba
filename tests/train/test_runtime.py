"""Runtime: strategy choice, batch arithmetic, precision, XLA, profile."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from helpers import dense_classifier
from typer.testing import CliRunner

from advtrain.attacks import Attack
from advtrain.backend.tensorflow.distribution import tf_configs
from advtrain.cli.commands import app
from advtrain.cli.launch import free_ports
from advtrain.models.adversarial import AdversarialModel
from advtrain.train.runtime import Runtime, make_runtime, plan_batches

runner = CliRunner()


def fake_runtime(replicas=1, name="default", spe="auto", **kw) -> Runtime:
    return Runtime(
        strategy=tf.distribute.get_strategy(),
        strategy_name=name,
        replicas=replicas,
        device_kind="cpu",
        precision="float32",
        jit_compile=False,
        steps_per_execution_setting=spe,
        **kw,
    )


@pytest.fixture
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


# ---------------------------------------------------------------- batches


def test_global_batch_splits_across_replicas_and_epochs_stay():
    plan = plan_batches(fake_runtime(4, "mirrored"), 10_000, batch_size=256, epochs=7)
    assert plan.per_replica_batch == 64
    assert plan.steps_per_epoch == 10_000 // 256  # from the global batch
    assert plan.epochs == 7  # never divided by workers or replicas
    text = plan.describe()
    assert "batch: global 256 = 4 replica(s) x 64; 39 steps/epoch x 7" in text


def test_batch_not_divisible_by_replicas_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        plan_batches(fake_runtime(3), 1000, batch_size=100)
    assert str(info.value) == (
        "batch_size: does not divide across 3 replicas; use a multiple of 3 "
        "(e.g. 99 or 102). Received: batch_size=100"
    )


def test_linear_lr_scaling_and_warmup_are_printed_with_numbers():
    plan = plan_batches(
        fake_runtime(),
        20_480,
        batch_size=1024,
        learning_rate=0.1,
        scale_lr=True,
        reference_batch=256,
        warmup_epochs=2,
    )
    assert plan.learning_rate == pytest.approx(0.4)
    assert plan.warmup_steps == 40
    assert (
        "learning rate 0.4 = 0.1 x 1024/256 (scale_lr: linear in the "
        "global batch), linear warm-up from 0 over 40 steps (2 epochs)"
    ) in plan.describe()


@pytest.mark.parametrize(
    ("steps", "setting", "expected"),
    [
        (22, "auto", 22),
        (40, "auto", 20),
        (64, "auto", 32),
        (37, "auto", 1),
        (40, 10, 10),
        (40, 12, 10),
        (40, 1, 1),
    ],
)
def test_steps_per_execution_divides_the_epoch(steps, setting, expected):
    plan = plan_batches(
        fake_runtime(spe=setting), 10_000, batch_size=8, steps_per_epoch=steps
    )
    assert plan.steps_per_execution == expected
    assert plan.steps_per_epoch % plan.steps_per_execution == 0
    if setting not in ("auto", expected):
        assert f"steps_per_execution={setting} -> {expected}" in plan.describe()


@pytest.mark.parametrize("name", ["mirrored", "multi_worker"])
def test_one_step_per_call_where_keras_cannot_loop(name):
    plan = plan_batches(fake_runtime(2, name, spe=8), 800, batch_size=8)
    assert plan.steps_per_execution == 1
    assert "keras-team/keras#19246" in plan.describe()


# ---------------------------------------------------------------- strategy


def test_default_runtime_describes_itself(float32_policy):
    runtime = make_runtime(strategy="default")
    assert (runtime.strategy_name, runtime.replicas) == ("default", 1)
    assert runtime.is_chief
    assert runtime.describe() == (
        "runtime: default strategy on cpu, 1 replica(s), float32, XLA off, "
        "backend tensorflow"
    )


def test_multi_worker_without_cluster_is_a_value_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ValueError, match="needs a cluster: TF_CONFIG"):
        make_runtime(strategy="multi_worker")


def test_auto_picks_multi_worker_from_tf_config_or_slurm(monkeypatch):
    from advtrain.backend.tensorflow.distribution import _auto_strategy

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TF_CONFIG", tf_configs(["a:1", "b:2"])[1])
    assert _auto_strategy() == "multi_worker"
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert _auto_strategy() == "multi_worker"
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG: expected JSON"):
        _auto_strategy()


@pytest.mark.parametrize(
    ("cluster", "task", "chief"),
    [
        ({"worker": ["a:1", "b:2"]}, ("worker", 0), True),
        ({"worker": ["a:1", "b:2"]}, ("worker", 1), False),
        ({"chief": ["c:0"], "worker": ["a:1"]}, ("worker", 0), False),
        ({"chief": ["c:0"], "worker": ["a:1"]}, ("chief", 0), True),
    ],
)
def test_only_the_chief_writes(cluster, task, chief):
    class Resolver:
        task_type, task_id = task

        def cluster_spec(self):
            return tf.train.ClusterSpec(cluster)

    class Strategy:
        cluster_resolver = Resolver()

    runtime = fake_runtime()
    runtime.strategy = Strategy()
    assert runtime.is_chief is chief


def test_cpu_replicas_after_tensorflow_started_is_a_value_error():
    tf.config.list_logical_devices("CPU")  # TensorFlow is initialised
    with pytest.raises(ValueError, match="already started"):
        make_runtime(cpu_replicas=3)


def test_launch_configs_name_one_loopback_cluster():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    addresses = [f"127.0.0.1:{p}" for p in ports]
    configs = [json.loads(c) for c in tf_configs(addresses)]
    assert {len(c["cluster"]["worker"]) for c in configs} == {3}
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": i} for i in range(3)
    ]


def test_launch_needs_two_workers(tmp_path):
    result = runner.invoke(app, ["launch", "quickstart", "--workers", "1"])
    assert result.exit_code == 2


# ---------------------------------------------------------------- XLA, bf16


def _short_fit(model, digits, batch=32, steps=2):
    x, y = digits
    model.fit(
        x[: batch * steps],
        y[: batch * steps],
        batch_size=batch,
        epochs=1,
        verbose=0,
        shuffle=False,
    )


@pytest.mark.parametrize(
    "attack",
    [Attack("fgsm_rs", eps=0.1), Attack("pgd", eps=0.1, steps=2)],
    ids=["fgsm_rs", "pgd"],
)
def test_adversarial_step_compiles_under_xla(digits, attack):
    classifier = dense_classifier()
    before = [w.copy() for w in classifier.get_weights()]
    model = AdversarialModel(classifier, attack, adv_weight=0.5, seed=0)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        steps_per_execution=2,
    )
    _short_fit(model, digits)
    assert model.jit_compile
    assert np.isfinite(model.get_metrics_result()["loss"])
    assert any(
        not np.allclose(a, b)
        for a, b in zip(before, classifier.get_weights(), strict=True)
    )


def test_mixed_bfloat16_keeps_logits_and_losses_float32(digits, float32_policy):
    from advtrain.models.classifier import build_classifier

    runtime = make_runtime(precision="mixed_bfloat16")
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    classifier = build_classifier((8, 8, 1), 10, width=4)
    model = AdversarialModel(classifier, Attack("fgsm_rs", eps=0.1), seed=0)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=runtime.jit_compile,
    )
    _short_fit(model, digits)
    assert classifier(digits[0][:2]).dtype == "float32"
    logs = model.get_metrics_result()
    assert all(np.isfinite(logs[k]) for k in ("loss", "clean_loss", "adv_loss"))


# ---------------------------------------------------------------- profile


def test_profile_says_what_bounds_the_run(tmp_path, float32_policy):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "data": {"source": "digits", "limit_train": 256, "limit_test": 64},
                "model": {"width": 4},
                "attack": {"method": "fgsm_rs", "eps": 0.1},
                "train": {"batch_size": 32},
            }
        )
    )
    result = runner.invoke(app, ["profile", str(recipe), "--steps", "4"])
    assert result.exit_code == 0, result.output
    out = result.output
    for part in ("input pipeline alone", "train step alone", "both, as `run` trains"):
        assert part in out
    assert "batch: global 32 = 1 replica(s) x 32; 8 steps/epoch" in out
    # The verdict follows from the two times it printed.
    times = {
        part: float(
            re.search(rf"{re.escape(part)}\s+([\d.,]+) ms", out)[1].replace(",", "")
        )
        for part in ("input pipeline alone", "train step alone")
    }
    bound = (
        "compute-bound"
        if times["train step alone"] > times["input pipeline alone"]
        else "input-bound"
    )
    assert f"verdict: {bound} by" in out
    assert "to change: " in out
    assert not list(tmp_path.glob("runs"))  # profile writes nothing


def test_onecycle_is_triangular():
    from advtrain.train.runtime import OneCycle

    lr = OneCycle(peak=0.01, warmup_steps=4, total_steps=10)
    values = [float(lr(step)) for step in (0, 2, 4, 7, 10, 12)]
    np.testing.assert_allclose(values, [0, 0.005, 0.01, 0.005, 0, 0], atol=1e-7)
    again = OneCycle.from_config(lr.get_config())
    assert float(again(7)) == pytest.approx(0.005)


def test_profile_advice_follows_the_cpu_and_the_step(tmp_path):
    from advtrain.cli.profile import ProfileReport, cpu_has_bfloat16

    def report(**changes):
        fields = dict(
            global_batch=64,
            replicas=1,
            steps_per_execution=1,
            timed_steps=8,
            input_seconds=0.001,
            step_seconds=0.05,
            together_seconds=0.05,
            device_kind="cpu",
            precision="float32",
            jit_compile=False,
            cache="memory",
            augment=False,
            attack="fgsm_rs",
        )
        fields.update(changes)
        return ProfileReport(**fields)

    tips = " ".join(report(cpu_bf16=True).advice())
    assert "mixed_bfloat16" in tips and "attack.reuse_gradient: true" in tips
    tips = " ".join(report(cpu_bf16=False, reuse_gradient=True).advice())
    assert "mixed_bfloat16" not in tips and "attack.reuse_gradient" not in tips
    tips = " ".join(report(step_seconds=0.002).advice())
    assert "steps_per_execution: auto" in tips
    assert report(input_seconds=0.2).bound == "input"

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx512f avx512_bf16\n")
    assert cpu_has_bfloat16(str(cpuinfo))
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx2\n")
    assert not cpu_has_bfloat16(str(cpuinfo))
    assert not cpu_has_bfloat16(str(tmp_path / "missing"))
