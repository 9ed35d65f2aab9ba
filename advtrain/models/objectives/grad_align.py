"""GradAlign (Andriushchenko and Flammarion 2020) as a one-hook subclass."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from advtrain.attacks.common import input_gradient, random_in_ball
from advtrain.models.adversarial import AdversarialModel
from advtrain.models.adversarial_metrics import OptionalMean, replicas_in_sync
from advtrain.models.objectives.registry import register_objective

_TINY = 1e-12


@register_objective("grad_align")
@keras.saving.register_keras_serializable(package="advtrain")
class GradAlign(AdversarialModel):
    """Adversarial training plus a gradient-alignment penalty.

    loss = the `AdversarialModel` loss + `grad_align` * mean over examples
    of (1 - cos(grad_x CE(x), grad_x CE(x + eta))), eta uniform in the
    attack's eps-ball: a locally linear loss counters catastrophic
    overfitting, at about three times a FGSM step's cost. Logged as
    `grad_align_loss` (before the weight).

    Args:
        grad_align: the penalty's weight (the paper: 0.2 for CIFAR-10 at
            eps 8/255, more for larger eps).
        clip_noise: clip `x + eta` to the attack's `[clip_min, clip_max]`;
            False (the paper's) leaves it unclipped.

    Example:

    ```python
    model = GradAlign(classifier, Attack("fgsm", eps=0.3), adv_weight=1.0,
                      grad_align=0.2)
    ```
    """

    def __init__(
        self,
        classifier,
        attack=None,
        grad_align: float = 0.2,
        clip_noise: bool = False,
        **kwargs: Any,
    ):
        super().__init__(classifier, attack, **kwargs)
        if not isinstance(clip_noise, bool):
            raise TypeError(
                f"clip_noise must be true or false. Received: clip_noise={clip_noise!r}"
            )
        if isinstance(grad_align, bool) or not isinstance(grad_align, (int, float)):
            raise TypeError(
                f"grad_align must be a number. Received: grad_align={grad_align!r}"
            )
        if grad_align < 0:
            raise ValueError(
                f"grad_align must be >= 0. Received: grad_align={grad_align}"
            )
        if self.attack is None:
            raise ValueError(
                "GradAlign needs an attack (its eps). Received: attack=None"
            )
        self.grad_align = float(grad_align)
        self.clip_noise = clip_noise
        self.grad_align_tracker = OptionalMean(name="grad_align_loss")

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        if self.grad_align == 0:
            return loss
        x, y = ops.cast(x, "float32"), ops.convert_to_tensor(y)
        noisy = x + random_in_ball(
            x, self.attack.eps, self.attack.norm, self.seed_generator
        )
        low, high = self.attack.clip_min, self.attack.clip_max
        if self.clip_noise and low is not None and high is not None:
            noisy = ops.clip(noisy, low, high)
        clean_grad = self._input_gradient(x, y)
        noisy_grad = self._input_gradient(noisy, y)
        penalty = self.reduce_per_example(
            1.0 - _cosine(clean_grad, noisy_grad), sample_weight
        )
        self.grad_align_tracker.update_state(penalty * replicas_in_sync())
        return loss + self.grad_align * penalty

    def _input_gradient(self, x, y):  # kept differentiable
        return input_gradient(
            self.attack_model_fn, x, y, loss_scale=self.attack_loss_scale()
        )

    def get_config(self):
        return {
            **super().get_config(),
            "grad_align": self.grad_align,
            "clip_noise": self.clip_noise,
        }


def _cosine(a, b):
    a = ops.reshape(a, (ops.shape(a)[0], -1))
    b = ops.reshape(b, (ops.shape(b)[0], -1))
    dot = ops.sum(a * b, axis=1)
    norms = ops.norm(a, axis=1) * ops.norm(b, axis=1)
    return dot / (norms + _TINY)
