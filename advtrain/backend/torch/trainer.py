"""`AdversarialModel`'s step on PyTorch: eager, as Keras's own PyTorch
trainer.

Variables update in place (BatchNorm statistics included);
`value_and_gradients` takes the loss's gradients with
`torch.autograd.grad`, leaving every `.grad` alone; the attack's input
gradients are taken inside Keras's `torch.no_grad()` test step too, and
its passes record no graph for the weights. They run the classifier in
inference mode (`attack_mode`), so they move no BatchNorm statistics.
"""

from __future__ import annotations

import keras
import torch

from advtrain.backend.torch.ops import recording

# A step sees the whole batch: one device, no replicas.
GLOBAL_BATCHES = True


def replicas_in_sync() -> int:
    return 1


def metric_count(metric) -> float:
    return float(keras.ops.convert_to_numpy(metric.count))


class AdversarialTrainer:
    """The PyTorch half of `AdversarialModel` (placed before `keras.Model`)."""

    _stepping = False

    def train_step(self, data):
        return self._stepped(self._train_step, data)

    def test_step(self, data):
        return self._stepped(self._test_step, data)

    def _stepped(self, step, data):
        object.__setattr__(self, "_stepping", True)
        try:
            return step(data)
        finally:
            object.__setattr__(self, "_stepping", False)

    def _in_step(self) -> bool:
        return self._stepping

    def value_and_gradients(self, loss_fn, inputs=()):
        inputs = [
            keras.ops.convert_to_tensor(x).detach().requires_grad_(True) for x in inputs
        ]
        variables = self.trainable_variables
        with recording():
            loss, aux = loss_fn(*inputs)
            scaled = self.optimizer.scale_loss(loss)
        tensors = [*inputs, *(v.value for v in variables)]
        gradients = torch.autograd.grad(scaled, tensors, allow_unused=True)
        n = len(inputs)
        input_grads = [
            torch.zeros_like(x) if g is None else g
            for x, g in zip(inputs, gradients[:n], strict=True)
        ]
        return loss.detach(), aux, input_grads, list(gradients[n:])

    def apply_gradients(self, gradients) -> None:
        with torch.no_grad():
            self.optimizer.apply(gradients, self.trainable_variables)

    def attack_step(self, generate):
        # The attack's result is a constant of the step: its forward passes
        # record no graph, its input gradients their own (`value_and_grad`
        # turns gradients on, inside Keras's `torch.no_grad()` test step too).
        with torch.no_grad():
            return generate()
