"""Training objectives: the registry (`register_objective`, `objectives`)
and the objectives beyond the mixed clean/adversarial loss, TRADES and
GradAlign, each an `AdversarialModel` subclass registered by name.
"""

from advtrain.models.objectives.registry import (
    objective_options,
    objectives,
    register_objective,
)

__all__ = ["objective_options", "objectives", "register_objective"]
