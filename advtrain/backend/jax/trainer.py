"""`AdversarialModel`'s step on JAX: stateless, as Keras's own JAX trainer.

Each step binds every variable to its state in a `keras.StatelessScope`;
`value_and_gradients` threads the non-trainable updates (BatchNorm
statistics) out of `jax.value_and_grad`; the attack's passes keep only
their random stream's advance and metric updates.
"""

from __future__ import annotations

import jax
import keras

# A step sees the global batch, which `keras.distribution` shards.
GLOBAL_BATCHES = True


def replicas_in_sync() -> int:
    return 1  # a JAX step sees the global batch (GLOBAL_BATCHES)


def metric_count(metric) -> float:
    return float(keras.ops.convert_to_numpy(metric.count))


def _values(variables) -> list:
    return [variable.value for variable in variables]


class AdversarialTrainer:
    """The JAX half of `AdversarialModel` (placed before `keras.Model`)."""

    _stepping = False

    def train_step(self, state, data):
        groups = (
            self.trainable_variables,
            self.non_trainable_variables,
            self.optimizer.variables,
            self.metrics_variables,
        )
        return self._bound(groups, state, lambda: self._train_step(data))

    def test_step(self, state, data):
        groups = (
            self.trainable_variables,
            self.non_trainable_variables,
            self.metrics_variables,
        )
        return self._bound(groups, state, lambda: self._test_step(data))

    def _bound(self, groups, state, step):
        mapping = [
            pair
            for variables, values in zip(groups, state, strict=True)
            for pair in zip(variables, values, strict=True)
        ]
        object.__setattr__(self, "_stepping", True)
        try:
            with keras.StatelessScope(state_mapping=mapping) as scope:
                logs = step()
        finally:
            object.__setattr__(self, "_stepping", False)
        return logs, tuple([scope.get_current_value(v) for v in vs] for vs in groups)

    def _in_step(self) -> bool:
        return self._stepping

    def value_and_gradients(self, loss_fn, inputs=()):
        trainable = self.trainable_variables
        others = [
            *self.non_trainable_variables,
            *self.optimizer.variables,
            *self.metrics_variables,
        ]
        other_values = _values(others)

        def scaled_loss(weights, inputs):
            mapping = [
                *zip(trainable, weights, strict=True),
                *zip(others, other_values, strict=True),
            ]
            with keras.StatelessScope(
                state_mapping=mapping, collect_losses=True
            ) as scope:
                loss, aux = loss_fn(*inputs)
                scaled = self.optimizer.scale_loss(loss)
            updates = [scope.get_current_value(v) for v in others]
            return scaled, (loss, aux, updates)

        grad_fn = jax.value_and_grad(scaled_loss, argnums=(0, 1), has_aux=True)
        (_, (loss, aux, updates)), (weight_grads, input_grads) = grad_fn(
            _values(trainable), list(inputs)
        )
        for variable, value in zip(others, updates, strict=True):
            variable.assign(value)
        return loss, aux, list(input_grads), list(weight_grads)

    def apply_gradients(self, gradients) -> None:
        # Stateless, as Keras's JAX trainer: a stateful `apply` inside the
        # step's scope leaks `LossScaleOptimizer`'s in-`cond` updates.
        optimizer, trainable = self.optimizer, self.trainable_variables
        weights, optimizer_values = optimizer.stateless_apply(
            _values(optimizer.variables), gradients, _values(trainable)
        )
        for variable, value in zip(
            [*trainable, *optimizer.variables],
            [*weights, *optimizer_values],
            strict=True,
        ):
            variable.assign(value)

    def attack_step(self, generate):
        optimizer = getattr(self, "optimizer", None)
        kept = [*self.metrics_variables, self.seed_generator.state]
        variables = [
            *self.trainable_variables,
            *self.non_trainable_variables,
            *(optimizer.variables if optimizer is not None else []),
            *self.metrics_variables,
        ]
        with keras.StatelessScope(
            state_mapping=list(zip(variables, _values(variables), strict=True))
        ) as scope:
            result = generate()
        for variable in kept:
            variable.assign(scope.get_current_value(variable))
        return result
