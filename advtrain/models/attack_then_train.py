"""`AdversarialModel`'s default training step: the attack through the
model's hooks (its result a constant of the step), then one training pass
over the clean and adversarial batch together, the loss from
`adversarial_loss`; and the eps ramp that scales the step's attack.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from advtrain.attacks import Attack
from advtrain.models import adversarial_metrics as am


def ramp_scale(iteration: Any, steps: int) -> Any:
    """The eps ramp's float32 scale at 0-based optimizer step `iteration`:
    `min(1, (iteration + 1) / steps)`. Computed from the step counter
    alone, so a resumed run continues the same ramp."""
    t = ops.cast(iteration, "float32") + 1.0
    return ops.minimum(1.0, t / float(steps))


def scaled_attack(attack: Attack, scale: Any) -> Attack:
    """`attack` with eps, and alpha, step_size and noise where set, times
    `scale`."""
    changes = {"eps": attack.eps * scale}
    for name in ("alpha", "step_size", "noise"):
        value = attack.settings.get(name)
        if value is not None:
            changes[name] = value * scale
    return attack.replace(**changes)


def train_step_after_attack(model, attack, x, y, sample_weight) -> dict:
    x_adv = None
    if model.adv_weight > 0 or model.needs_clean_logits:
        x_adv = model.attack_step(
            lambda: model.generate_adversarial(x, y, attack=attack)
        )

    def loss_fn():
        y_pred, y_pred_adv = _forward(model, x, x_adv)
        loss = model.adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        return loss, (y_pred, y_pred_adv)

    loss, (y_pred, y_pred_adv), _, gradients = model.value_and_gradients(loss_fn)
    am.track_loss(model.loss_tracker, loss, x)
    model.apply_gradients(gradients)
    if y_pred_adv is not None:
        model.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
    if y_pred is None:
        # adv_weight == 1: clean metrics (and clean_loss, for the log)
        # from an inference pass; it takes no part in the gradient.
        y_pred = model(x, training=False)
        if not model.clean_loss_tracker.fed:
            clean = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
            )
            model.track_losses(clean=clean)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _forward(model, x, x_adv):
    # One forward pass: one BatchNorm update per step.
    if x_adv is None:
        return model(x, training=True), None
    if model.adv_weight == 1.0 and not model.needs_clean_logits:
        return None, model(x_adv, training=True)
    both = model(ops.concatenate([x, x_adv], axis=0), training=True)
    y_pred, y_pred_adv = ops.split(both, 2, axis=0)
    return y_pred, y_pred_adv
