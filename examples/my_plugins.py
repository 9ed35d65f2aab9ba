"""A plugin module: one attack and one training objective, registered by
name so a recipe can pick them (`plugins: [my_plugins]`).

Importing this module registers them; `plugin_attack_and_objective.py`
shows a recipe that uses both. `CALLS` records what ran, for the example
to print.

Runs on: TensorFlow (written with `tf` ops; with `keras.ops` instead the
same plugins run on JAX too).
"""

import keras
import tensorflow as tf

import advtrain
from advtrain.attacks.common import attack_inputs, clip_pixels, input_gradient

CALLS = []


@advtrain.register_attack("fgsm_jitter")
def fgsm_jitter(
    model_fn, x, y=None, *, eps, jitter=0.5, loss_fn=None, loss_scale=None,
    clip_min=0.0, clip_max=1.0, seed=None,
):  # fmt: skip
    """FGSM from a random point at most `jitter * eps` away.

    Its keyword arguments are its settings: `jitter` is one of its own
    (`Attack("fgsm_jitter", eps=0.1, jitter=0.25)`, or `attack.options` in
    a recipe); `loss_fn`, `loss_scale` and `seed` come with each call.
    """
    # Python code here runs when TensorFlow traces the attack, not per batch.
    CALLS.append(f"fgsm_jitter traced with jitter={jitter}")
    x, y = attack_inputs(model_fn, x, y)
    start = x + keras.random.uniform(
        tf.shape(x), -jitter * eps, jitter * eps, seed=seed
    )
    start = clip_pixels(start, clip_min, clip_max)
    grad = input_gradient(model_fn, start, y, loss_fn, loss_scale)
    x_adv = start + eps * tf.sign(grad)
    # Project back into the eps-ball around x, then into the pixel range.
    return clip_pixels(tf.clip_by_value(x_adv, x - eps, x + eps), clip_min, clip_max)


@advtrain.register_objective("confidence_penalty")
class ConfidencePenalty(advtrain.AdversarialModel):
    """The mixed clean/adversarial loss minus `beta` x the entropy of the
    adversarial predictions: over-confident adversarial logits cost more.

    A recipe fills the `AdversarialModel` keywords (adv_weight, seed, ...)
    through `**kwargs`; `beta` comes from `attack.objective_options`.
    """

    def __init__(self, classifier, attack=None, beta=0.1, **kwargs):
        super().__init__(classifier, attack, **kwargs)
        self.beta = beta
        CALLS.append(f"confidence_penalty built with beta={beta}")

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        if y_pred_adv is None:  # adv_weight 0: no adversarial batch
            return loss
        log_p = tf.nn.log_softmax(y_pred_adv)
        entropy = -tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1)
        return loss - self.beta * self.reduce_per_example(entropy, sample_weight)

    def get_config(self):
        return {**super().get_config(), "beta": self.beta}
