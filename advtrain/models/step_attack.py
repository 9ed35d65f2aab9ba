"""The attack a training step runs, as a pure function of the step counter.

With an eps ramp, the training step attacks with `AdversarialModel.attack`
scaled by `EpsRamp` at `optimizer.iterations`; `test_step` and evaluation
use the full attack. The scaled attack is computed per step
(`training_attack`) and handed to the attack hooks through `attacking_with`:
a context, as Keras hands `training` to nested calls, so `model.attack`
reads the step's attack inside and the model's own attributes never change
while a step traces (a replica thread or a nested model sees its own).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Optional

from advtrain.attacks import Attack

# (model, attack) of the step being traced in this context, or None.
_STEP: contextvars.ContextVar = contextvars.ContextVar(
    "advtrain_step_attack", default=None
)


def training_attack(
    attack: Optional[Attack], ramp_steps: int, iteration: Any
) -> Optional[Attack]:
    """`attack` with eps and step sizes scaled by an eps ramp of
    `ramp_steps` steps at 0-based optimizer step `iteration`; `attack`
    itself without a ramp."""
    if not ramp_steps or attack is None:
        return attack
    from advtrain.models.eps_ramp import EpsRamp

    ramp = EpsRamp(ramp_steps)
    return ramp.scaled(attack, ramp.scale(iteration))


@contextlib.contextmanager
def attacking_with(model: Any, attack: Optional[Attack]) -> Iterator[None]:
    """Inside, `step_attack(model, ...)` is `attack`."""
    token = _STEP.set((model, attack))
    try:
        yield
    finally:
        _STEP.reset(token)


def step_attack(model: Any, default: Optional[Attack]) -> Optional[Attack]:
    """The attack `attacking_with` set for `model`, else `default`."""
    scoped = _STEP.get()
    return scoped[1] if scoped is not None and scoped[0] is model else default
