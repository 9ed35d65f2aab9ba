"""`AdversarialModel`'s default training step: the attack, then one
training pass over the clean and adversarial batch together.

The attack runs through the model's hooks (`generate_adversarial`, with
the classifier in `attack_mode`, inference by default: no BatchNorm
update, no dropout) and its result is a constant of the step
(`stop_gradient`); the loss comes from the `adversarial_loss` hook. For
FGSM a step costs 3 forward + 3 backward passes. Written in `keras.ops`;
the gradients, the optimizer and the attack's state updates go through
the model's backend trainer (`advtrain.models.trainers`).
"""

from __future__ import annotations

from keras import ops

from advtrain.models import adversarial_metrics as am


def train_step_after_attack(model, attack, x, y, sample_weight) -> dict:
    """The attack (inference mode by default), then one training pass
    over the clean and adversarial batch together."""
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
    """Training-mode logits for the clean and adversarial batches.

    Both go through one forward pass: one BatchNorm update per step and
    better device utilisation than two half-size passes.
    """
    if x_adv is None:
        return model(x, training=True), None
    if model.adv_weight == 1.0 and not model.needs_clean_logits:
        return None, model(x_adv, training=True)
    both = model(ops.concatenate([x, x_adv], axis=0), training=True)
    y_pred, y_pred_adv = ops.split(both, 2, axis=0)
    return y_pred, y_pred_adv
