"""Training objectives: the registry and the `AdversarialModel` subclasses
registered in it (TRADES, GradAlign)."""

from advtrain.models.objectives.registry import (
    objective_options,
    objectives,
    register_objective,
)

__all__ = ["objective_options", "objectives", "register_objective"]
