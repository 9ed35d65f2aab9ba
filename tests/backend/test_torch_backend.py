"""What differs on Keras's PyTorch backend (advtrain/backend/torch): the
attack runs with gradients inside Keras's `torch.no_grad()` test step and
moves no BatchNorm statistics, GradAlign's input gradient stays
differentiable, the stateless draws and loops, and the one-device
runtime. The PyTorch tier (scripts/test_torch) runs these."""

import keras
import numpy as np
import pytest
from helpers import sgd_compiled
from keras import ops

from advtrain import backend
from advtrain.attacks import Attack
from advtrain.models import AdversarialModel, GradAlign
from advtrain.utils.errors import ArgumentError

pytestmark = [
    pytest.mark.backend_neutral,
    pytest.mark.skipif(
        keras.backend.backend() != "torch", reason="runs in the PyTorch tier only"
    ),
]


def _cnn(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Flatten()(keras.layers.ReLU()(h))
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def _moving(model):
    return [
        ops.convert_to_numpy(v).copy()
        for v in model.non_trainable_variables
        if "moving" in v.path
    ]


def test_the_attack_moves_no_batchnorm_statistics_and_runs_in_evaluate(digits):
    x, y = digits[0][:32], digits[1][:32]
    model = sgd_compiled(AdversarialModel(_cnn(), Attack("pgd", eps=0.1, steps=2), 1.0))
    model.build((None, 8, 8, 1))
    before = _moving(model)
    x_adv = model.attack_step(
        lambda: model.generate_adversarial(ops.convert_to_tensor(x), y)
    )
    for a, b in zip(before, _moving(model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(ops.max(ops.abs(x_adv - x))) > 0.05  # it attacked
    # Keras's test step runs under torch.no_grad(): the attack still steps.
    logs = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    assert logs["adv_loss"] > logs["clean_loss"]
    for a, b in zip(before, _moving(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_training_step_updates_batchnorm_once(digits):
    # The attack's passes leave the statistics alone, so the moving mean
    # moves exactly as one training pass over the adversarial batch does.
    x, y = digits[0][:16], digits[1][:16]
    model = sgd_compiled(
        AdversarialModel(_cnn(), Attack("fgsm_rs", eps=0.1), 1.0, seed=0)
    )
    model.build((None, 8, 8, 1))
    model.train_on_batch(x, y)
    after_one = _moving(model)
    twin = sgd_compiled(
        AdversarialModel(_cnn(), Attack("fgsm_rs", eps=0.1), 1.0, seed=0)
    )
    twin.build((None, 8, 8, 1))
    x_adv = twin.attack_step(
        lambda: twin.generate_adversarial(ops.convert_to_tensor(x), y)
    )
    twin.classifier(x_adv, training=True)
    for a, b in zip(after_one, _moving(twin), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_grad_align_penalty_reaches_the_weights(digits):
    # GradAlign differentiates an input gradient: the weights' gradient
    # must change with the penalty's weight (double backward).
    x = ops.convert_to_tensor(digits[0][:32])
    y = ops.convert_to_tensor(digits[1][:32])

    def weight_gradient(grad_align):
        model = GradAlign(
            _cnn(seed=1), Attack("fgsm", eps=0.1), grad_align, adv_weight=0.5
        )
        sgd_compiled(model).build((None, 8, 8, 1))

        def loss_fn():
            y_pred = model(x, training=False)
            loss = model.adversarial_loss(x, y, y_pred, None, None, None)
            return loss, None

        _, _, _, grads = model.value_and_gradients(loss_fn)
        return np.concatenate([ops.convert_to_numpy(g).ravel() for g in grads])

    assert np.abs(weight_gradient(10.0) - weight_gradient(0.0)).max() > 1e-6


def test_stateless_draws_and_counted_loops():
    seed = ops.convert_to_tensor([3, 7], "int32")
    a = backend.stateless_uniform((4, 5), seed)
    b = backend.stateless_uniform((4, 5), seed)
    np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
    # Either word changes the draws (a loop's counter is the first).
    for step in ([0, 1], [1, 0]):
        c = backend.stateless_uniform((4, 5), seed + ops.convert_to_tensor(step))
        assert not np.array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(c))
    assert 0.0 <= float(ops.min(a)) and float(ops.max(a)) < 1.0
    count = ops.convert_to_tensor(4, "int32")
    _, x = backend.counted_loop(
        lambda i, x: (i + 1, 2 * x + 1), (0, ops.ones(2)), count
    )
    np.testing.assert_allclose(ops.convert_to_numpy(x), 31.0)
    mask = ops.convert_to_tensor([True, False, True])
    np.testing.assert_array_equal(
        ops.convert_to_numpy(backend.active_indices(mask)), [0, 2]
    )


def test_the_runtime_is_one_device_and_one_step_per_call():
    from advtrain.train.runtime import make_runtime, plan_batches

    runtime = make_runtime(backend="torch")
    assert (runtime.strategy_name, runtime.replicas) == ("default", 1)
    plan = plan_batches(runtime, 1024, batch_size=64, epochs=1)
    assert plan.steps_per_execution == 1
    with pytest.raises(ArgumentError, match=r"Received: strategy=mirrored$"):
        make_runtime(strategy="mirrored")
