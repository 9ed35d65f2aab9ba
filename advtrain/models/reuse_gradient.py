"""The gradient-reusing training step of `AdversarialModel`, and when it runs.

For plain FGSM with a clean loss term (0 < adv_weight < 1), the clean
pass's backward pass already holds FGSM's input gradient: 2 forward + 2
backward passes instead of 3 + 3 (Goodfellow et al.). The attack sees
training-mode BatchNorm; the step calls none of the attack hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

from keras import ops

from advtrain.attacks import Attack
from advtrain.attacks.common import as_float_tensor
from advtrain.models import adversarial_metrics as am
from advtrain.utils.errors import ArgumentError

# A subclass overriding one of these hooks never gets the step.
REUSE_GRADIENT_BYPASSES = (
    "generate_adversarial",
    "adversarial_loss",
    "attack_model_fn",
    "attack_loss_scale",
)


def choose_step(
    reuse_gradient: Union[bool, str],
    attack: Optional[Attack],
    adv_weight: float,
    owner: str = "AdversarialModel",
    overridden: Sequence[str] = (),
) -> tuple[bool, str]:
    """(whether to train with the gradient-reusing step, why), for the
    model class `owner` that overrides the hooks `overridden`."""
    if reuse_gradient is True:
        _check_forced(owner, attack, overridden)
        return True, "reuse_gradient=True"
    if reuse_gradient is False:
        return False, "reuse_gradient=False"
    if reuse_gradient != "auto":
        raise ArgumentError(
            "reuse_gradient",
            "must be True, False or 'auto'. "
            f"Received: reuse_gradient={reuse_gradient!r}",
        )
    if attack is None or adv_weight == 0:
        return False, "auto: no attack in training (adv_weight=0)"
    if overridden:
        return False, f"auto: {owner} overrides {', '.join(overridden)}"
    if attack.method != "fgsm" or not attack.fusable:
        return False, (
            f"auto: method {attack.method} on the {attack.backend} backend "
            "is not plain FGSM from the clean point"
        )
    if adv_weight == 1:
        return False, "auto: adv_weight=1, no clean loss term to reuse"
    return True, "auto: plain FGSM from the clean point, 0 < adv_weight < 1"


def _check_forced(owner: str, attack: Optional[Attack], overridden) -> None:
    if overridden:
        raise ArgumentError(
            "reuse_gradient",
            "reuse_gradient=True needs the default generate_adversarial, "
            "adversarial_loss, attack_model_fn and attack_loss_scale hooks "
            f"(the gradient-reusing step calls none of them); {owner} "
            f"overrides {', '.join(overridden)}. Received: reuse_gradient=True",
        )
    if attack is None or not attack.fusable:
        received = (
            "attack=None"
            if attack is None
            else f"method={attack.method!r}, backend={attack.backend!r}"
        )
        raise ArgumentError(
            "reuse_gradient",
            "reuse_gradient=True needs a single-step attack (method fgsm or "
            f"fgsm_rs, backend advtrain). Received: {received}",
        )


def train_step_reusing_gradient(model, attack: Attack, x, y, sample_weight) -> dict:
    """One training step, `attack` stepped from the clean pass's input
    gradient: BatchNorm statistics update twice; the weight gradients mix
    as (1 - w) clean + w adv."""
    w = model.adv_weight
    x = as_float_tensor(x)  # the attack's own check: float pixels

    def clean_loss(x):
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        return loss, y_pred

    clean, y_pred, (input_grad,), clean_grads = model.value_and_gradients(
        clean_loss, [x]
    )
    am.track_zero_gradients(model.zero_grad_tracker, input_grad)
    x_adv = ops.stop_gradient(
        attack.step_from_gradient(x, input_grad, model.seed_generator)
    )

    def adv_loss():
        y_pred_adv = model(x_adv, training=True)
        loss = model.compute_loss(
            x=x_adv, y=y, y_pred=y_pred_adv, sample_weight=sample_weight
        )
        return loss, y_pred_adv

    adv, y_pred_adv, _, adv_grads = model.value_and_gradients(adv_loss)
    gradients = [_mixed(gc, ga, w) for gc, ga in zip(clean_grads, adv_grads)]  # noqa: B905 (traced: autograph)
    model.apply_gradients(gradients)
    am.track_loss(model.loss_tracker, (1.0 - w) * clean + w * adv, x)
    model.track_losses(clean=clean, adv=adv)
    model.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _mixed(clean_grad, adv_grad, w: float):
    # A missing gradient counts as zero.
    if clean_grad is None and adv_grad is None:
        return None
    clean_grad = 0.0 if clean_grad is None else clean_grad
    adv_grad = 0.0 if adv_grad is None else adv_grad
    return (1.0 - w) * clean_grad + w * adv_grad
