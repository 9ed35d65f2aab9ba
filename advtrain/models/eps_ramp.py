"""`EpsRamp`: the training attack's eps and step sizes ramped up linearly."""

from __future__ import annotations

from typing import Any

from keras import ops

from advtrain.attacks import Attack


class EpsRamp:
    """Scales the training attack's eps and steps from ~0 to full over `steps`.

    At optimizer step `t` (0-based: `optimizer.iterations` before the
    update) the scale is `min(1, (t + 1) / steps)`: 1/steps at the first
    step, 1 from step `steps - 1` on. eps, the FGSM-RS step `alpha`, the
    PGD `step_size` and the N-FGSM `noise` (where set; their defaults
    follow eps) are multiplied
    by it, so the perturbation's largest norm is `scale * eps`. The scale
    is computed in the graph from the step counter alone, so a resumed run
    (which restores `optimizer.iterations`) continues the same ramp with no
    state of its own. Evaluation attacks are built elsewhere and always use
    the full eps.

    A ramp keeps single-step training from meeting the full eps while
    the network is still random: a candidate remedy for catastrophic
    overfitting (scripts/bench_mnist_robust measures it).

    Example:

    ```python
    ramp = EpsRamp(steps=3 * 600)  # 3 epochs of 600 steps
    attack = ramp.scaled(Attack("fgsm_rs", eps=0.3), ramp.scale(iteration))
    ```
    """

    def __init__(self, steps: int):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"EpsRamp steps must be an integer >= 1. Received: steps={steps!r}"
            )
        self.steps = steps

    def scale(self, iteration: Any) -> Any:
        """The float32 scale in (0, 1] at 0-based optimizer step `iteration`."""
        t = ops.cast(iteration, "float32") + 1.0
        return ops.minimum(1.0, t / float(self.steps))

    @staticmethod
    def scaled(attack: Attack, scale: Any) -> Attack:
        """`attack` with eps, and alpha, step_size and noise where its
        method has them set, times `scale`."""
        changes = {"eps": attack.eps * scale}
        for name in ("alpha", "step_size", "noise"):
            value = attack.settings.get(name)
            if value is not None:
                changes[name] = value * scale
        return attack.replace(**changes)
