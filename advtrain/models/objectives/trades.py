"""TRADES (Zhang et al. 2019) as a two-hook subclass of AdversarialModel."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from advtrain.models.adversarial import AdversarialModel
from advtrain.models.objectives.registry import register_objective


def per_example_kl(p_clean, logits_adv):
    """KL(p_clean || softmax(logits_adv)) per example, in float32."""
    p = ops.cast(p_clean, "float32")
    log_q = ops.log_softmax(ops.cast(logits_adv, "float32"), axis=-1)
    log_p = ops.log(ops.clip(p, 1e-12, 1.0))
    return ops.sum(p * (log_p - log_q), axis=-1)


@register_objective("trades")
@keras.saving.register_keras_serializable(package="advtrain")
class TRADES(AdversarialModel):
    """Trades accuracy for robustness with a KL term.

    loss = CE(y, f(x)) + beta * KL(f(x) || f(x_adv)), x_adv maximising the
    KL with PGD (the attack's eps, steps, step_size; keep its random
    start: the KL's minimum, x, has a noise gradient). Logged: the CE as
    `clean_loss`, the KL as `adv_loss`.

    Example:

    ```python
    model = TRADES(classifier, Attack("pgd", eps=0.3, steps=10), beta=6.0)
    ```
    """

    needs_clean_logits = True
    # The method that maximises the KL, whatever the attack's own.
    attack_method = "pgd"

    def __init__(self, classifier, attack=None, beta: float = 6.0, **kwargs: Any):
        kwargs.setdefault("adv_weight", 0.5)
        super().__init__(classifier, attack, **kwargs)
        if self.attack is None:
            raise ValueError(
                "TRADES needs an attack (its eps, steps and step size "
                "maximise the KL term). Received: attack=None"
            )
        if not isinstance(beta, (int, float)) or beta < 0:
            raise ValueError(f"beta must be >= 0. Received: beta={beta!r}")
        self.beta = float(beta)

    def generate_adversarial(self, x, y, attack=None):
        p_clean = ops.stop_gradient(
            ops.softmax(ops.cast(self.attack_model_fn(x), "float32"), axis=-1)
        )
        # The KL's maximiser is PGD on the advtrain backend, one start.
        attack = (self.attack if attack is None else attack).replace(
            method=self.attack_method, backend="advtrain", restarts=1
        )
        x_adv = attack(
            self.attack_model_fn,
            x,
            p_clean,
            loss_fn=per_example_kl,
            loss_scale=self.attack_loss_scale(),
            seed=self.seed_generator,
        )
        return ops.stop_gradient(x_adv)

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        natural = self.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
        )
        p_clean = ops.softmax(ops.cast(y_pred, "float32"), axis=-1)
        robust = self.reduce_per_example(
            per_example_kl(p_clean, y_pred_adv), sample_weight
        )
        self.track_losses(clean=natural, adv=robust)
        return natural + self.beta * robust

    def get_config(self):
        return {**super().get_config(), "beta": self.beta}
