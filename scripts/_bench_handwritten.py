"""scripts/bench_backends' hand-written steps: the default `AdversarialModel`
step and the `mnist_fast` step written as a user would on each backend,
against which advtrain's own steps are timed.

TensorFlow: one `tf.function` (XLA as the advtrain model compiles, i.e.
`model.jit_compile`) with `tf.GradientTape`s and the optimizer's
`apply_gradients`. JAX: one `jax.jit` of a pure function on the variables'
values (`stateless_call`, `jax.value_and_grad`, `optimizer.stateless_apply`),
the state donated, as Keras's JAX trainer does. PyTorch: eager, as Keras's
torch trainer runs by default: `torch.autograd.grad` on the variables'
tensors and the optimizer's `apply` under `torch.no_grad`. Same classifier
(a fresh copy of its architecture, the same initial weights), attack, loss,
optimizer and schedule, batch; no metrics but the loss, which each step
returns and the timer reads (one host sync per step, as for `fit`);
batches from `tf.data` on TensorFlow, NumPy slices elsewhere (`batches`).
"""

from __future__ import annotations

import statistics
import time

import keras
from keras import ops


def pass_seconds(step, x, y, batch: int, steps: int) -> float:
    """The median seconds per step over one pass of `steps` steps (the
    intervals between the ends of consecutive steps, as
    `step_seconds` of `_bench_parts.StepTimer`'s marks), each step's loss
    read on the host."""
    marks = []
    for xb, yb in batches(x[: batch * steps], y[: batch * steps], batch):
        float(ops.convert_to_numpy(step(xb, yb)))
        marks.append(time.perf_counter())
    return step_seconds(marks)


def step_seconds(marks) -> float:
    """The median interval between consecutive marks: a step that the
    shared machine's load interrupted does not move it."""
    return statistics.median(b - a for a, b in zip(marks[:-1], marks[1:], strict=True))


def batches(x, y, batch: int):
    """The batches as each backend's own loop feeds them: a `tf.data`
    pipeline on TensorFlow, NumPy slices elsewhere."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
        return dataset.prefetch(tf.data.AUTOTUNE)
    return ((x[i : i + batch], y[i : i + batch]) for i in range(0, len(y), batch))


def per_example_ce(y, logits):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


def per_example_kl(p, logits):
    """KL(p || softmax(logits)) per example, in float32 (TRADES's)."""
    log_q = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    return ops.sum(p * (ops.log(ops.clip(p, 1e-12, 1.0)) - log_q), axis=-1)


def fgsm_step(x, grad, eps):
    return ops.clip(x + eps * ops.sign(grad), 0.0, 1.0)


def pgd_step(x, x_adv, grad, eps, step_size):
    moved = ops.clip(x_adv + step_size * ops.sign(grad), 0.0, 1.0)
    return ops.clip(x + ops.clip(moved - x, -eps, eps), 0.0, 1.0)


def ramp(iteration, ramp_steps: int):
    return ops.minimum(1.0, (ops.cast(iteration, "float32") + 1.0) / ramp_steps)


def default_step(classifier, optimizer, eps: float, jit_compile: bool):
    """FGSM from the clean pass's input gradient, weights on the 50/50 mix
    of the clean and adversarial cross-entropies (advtrain's default)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return _tf_default(classifier, optimizer, eps, jit_compile)
    if backend == "torch":
        return _torch_default(classifier, optimizer, eps)
    return _jax_default(classifier, optimizer, eps)


def fast_step(classifier, optimizer, model, jit_compile: bool):
    """TRADES: PGD on the KL from a random start (inference mode), eps and
    step ramped by the optimizer's step, then CE + beta * KL on one pass
    over the clean and adversarial batch; the settings are `model`'s (the
    recipe's TRADES model)."""
    attack = model.attack
    settings = (
        attack.eps,
        attack.settings["step_size"],
        attack.steps,
        model.beta,
        model.eps_ramp_steps,
    )
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return _tf_fast(classifier, optimizer, settings, jit_compile)
    if backend == "torch":
        return _torch_fast(classifier, optimizer, settings)
    return _jax_fast(classifier, optimizer, settings)


# ------------------------------------------------------------ TensorFlow
def _tf_default(classifier, optimizer, eps, jit_compile):
    import tensorflow as tf

    weights = classifier.trainable_variables
    optimizer.build(weights)

    def loss_fn(x, y):
        return ops.mean(per_example_ce(y, classifier(x, training=True)))

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        x = tf.cast(x, "float32")
        with tf.GradientTape() as tape:
            tape.watch(x)
            clean = loss_fn(x, y)
        x_grad, *clean_grads = tape.gradient(clean, [x, *weights])
        x_adv = tf.stop_gradient(fgsm_step(x, x_grad, eps))
        with tf.GradientTape() as tape:
            adv = loss_fn(x_adv, y)
        adv_grads = tape.gradient(adv, weights)
        grads = [0.5 * c + 0.5 * a for c, a in zip(clean_grads, adv_grads, strict=True)]
        optimizer.apply_gradients(zip(grads, weights, strict=True))
        return 0.5 * clean + 0.5 * adv

    return step


def _tf_fast(classifier, optimizer, settings, jit_compile):
    import tensorflow as tf

    eps, step_size, steps, beta, ramp_steps = settings
    weights = classifier.trainable_variables
    optimizer.build(weights)
    seed = keras.random.SeedGenerator(0)

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        x = tf.cast(x, "float32")
        scale = ramp(optimizer.iterations, ramp_steps)
        eps_t, step_t = eps * scale, step_size * scale
        p_clean = tf.stop_gradient(ops.softmax(classifier(x, training=False)))
        noise = keras.random.uniform(tf.shape(x), -1.0, 1.0, seed=seed)
        x_adv = ops.clip(x + eps_t * noise, 0.0, 1.0)
        for _ in range(steps):
            with tf.GradientTape() as tape:
                tape.watch(x_adv)
                kl = ops.sum(per_example_kl(p_clean, classifier(x_adv, training=False)))
            x_adv = pgd_step(x, x_adv, tape.gradient(kl, x_adv), eps_t, step_t)
        x_adv = tf.stop_gradient(x_adv)
        with tf.GradientTape() as tape:
            both = classifier(tf.concat([x, x_adv], 0), training=True)
            clean, adv = tf.split(both, 2)
            loss = ops.mean(per_example_ce(y, clean)) + beta * ops.mean(
                per_example_kl(ops.softmax(clean), adv)
            )
        grads = tape.gradient(loss, weights)
        optimizer.apply_gradients(zip(grads, weights, strict=True))
        return loss

    return step


# ------------------------------------------------------------------- JAX
class _JaxStep:
    """A jitted pure step on (weights, others, optimizer values, key, step),
    the state kept between calls and donated to the next."""

    def __init__(self, classifier, optimizer, body):
        import jax

        optimizer.build(classifier.trainable_variables)
        self.state = (
            [v.value for v in classifier.trainable_variables],
            [v.value for v in classifier.non_trainable_variables],
            [v.value for v in optimizer.variables],
            jax.random.key(0),
            jax.numpy.zeros((), "int32"),
        )
        self.compiled = jax.jit(body, donate_argnums=0)

    def __call__(self, x, y):
        loss, self.state = self.compiled(self.state, x, y)
        return loss


def _jax_default(classifier, optimizer, eps):
    import jax

    def loss_fn(weights, others, x, y):
        logits, others = classifier.stateless_call(weights, others, x, training=True)
        return ops.mean(per_example_ce(y, logits)), others

    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 2), has_aux=True)

    def body(state, x, y):
        weights, others, opt, key, i = state
        x = x.astype("float32")
        (clean, others), (clean_grads, x_grad) = grad_fn(weights, others, x, y)
        x_adv = jax.lax.stop_gradient(fgsm_step(x, x_grad, eps))
        (adv, others), (adv_grads, _) = grad_fn(weights, others, x_adv, y)
        grads = [0.5 * c + 0.5 * a for c, a in zip(clean_grads, adv_grads, strict=True)]
        weights, opt = optimizer.stateless_apply(opt, grads, weights)
        return 0.5 * clean + 0.5 * adv, (weights, others, opt, key, i + 1)

    return _JaxStep(classifier, optimizer, body)


def _jax_fast(classifier, optimizer, settings):
    import jax

    eps, step_size, steps, beta, ramp_steps = settings

    def logits(weights, others, x, training):
        return classifier.stateless_call(weights, others, x, training=training)

    def kl_sum(x_adv, weights, others, p_clean):
        return ops.sum(
            per_example_kl(p_clean, logits(weights, others, x_adv, False)[0])
        )

    def loss_fn(weights, others, x, x_adv, y):
        both, others = logits(weights, others, ops.concatenate([x, x_adv]), True)
        clean, adv = ops.split(both, 2)
        kl = ops.mean(per_example_kl(ops.softmax(clean), adv))
        return ops.mean(per_example_ce(y, clean)) + beta * kl, others

    def body(state, x, y):
        weights, others, opt, key, i = state
        x = x.astype("float32")
        scale = ramp(i, ramp_steps)
        eps_t, step_t = eps * scale, step_size * scale
        p_clean = jax.nn.softmax(logits(weights, others, x, False)[0])
        key, draw = jax.random.split(key)
        noise = jax.random.uniform(draw, x.shape, minval=-1.0, maxval=1.0)
        x_adv = ops.clip(x + eps_t * noise, 0.0, 1.0)
        for _ in range(steps):
            grad = jax.grad(kl_sum)(x_adv, weights, others, p_clean)
            x_adv = pgd_step(x, x_adv, grad, eps_t, step_t)
        x_adv = jax.lax.stop_gradient(x_adv)
        (loss, others), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            weights, others, x, x_adv, y
        )
        weights, opt = optimizer.stateless_apply(opt, grads, weights)
        return loss, (weights, others, opt, key, i + 1)

    return _JaxStep(classifier, optimizer, body)


# --------------------------------------------------------------- PyTorch
def _torch_default(classifier, optimizer, eps):
    import torch

    weights = classifier.trainable_variables
    optimizer.build(weights)
    tensors = [w.value for w in weights]

    def loss_fn(x, y):
        return ops.mean(per_example_ce(y, classifier(x, training=True)))

    def step(x, y):
        x = ops.convert_to_tensor(x, "float32").requires_grad_(True)
        y = ops.convert_to_tensor(y)
        clean = loss_fn(x, y)
        x_grad, *clean_grads = torch.autograd.grad(clean, [x, *tensors])
        x_adv = fgsm_step(x.detach(), x_grad, eps)
        adv = loss_fn(x_adv, y)
        adv_grads = torch.autograd.grad(adv, tensors)
        grads = [0.5 * c + 0.5 * a for c, a in zip(clean_grads, adv_grads, strict=True)]
        with torch.no_grad():
            optimizer.apply(grads, weights)
        return (0.5 * clean + 0.5 * adv).detach()

    return step


def _torch_fast(classifier, optimizer, settings):
    import torch

    eps, step_size, steps, beta, ramp_steps = settings
    weights = classifier.trainable_variables
    optimizer.build(weights)
    tensors = [w.value for w in weights]
    seed = keras.random.SeedGenerator(0)

    def step(x, y):
        x, y = ops.convert_to_tensor(x, "float32"), ops.convert_to_tensor(y)
        scale = ramp(optimizer.iterations, ramp_steps)
        eps_t, step_t = eps * scale, step_size * scale
        with torch.no_grad():
            p_clean = ops.softmax(classifier(x, training=False))
        noise = keras.random.uniform(ops.shape(x), -1.0, 1.0, seed=seed)
        x_adv = ops.clip(x + eps_t * noise, 0.0, 1.0)
        for _ in range(steps):
            x_adv = x_adv.detach().requires_grad_(True)
            kl = ops.sum(per_example_kl(p_clean, classifier(x_adv, training=False)))
            (grad,) = torch.autograd.grad(kl, [x_adv])
            x_adv = pgd_step(x, x_adv.detach(), grad, eps_t, step_t)
        both = classifier(ops.concatenate([x, x_adv]), training=True)
        clean, adv = ops.split(both, 2)
        loss = ops.mean(per_example_ce(y, clean)) + beta * ops.mean(
            per_example_kl(ops.softmax(clean), adv)
        )
        grads = torch.autograd.grad(loss, tensors)
        with torch.no_grad():
            optimizer.apply(list(grads), weights)
        return loss.detach()

    return step
