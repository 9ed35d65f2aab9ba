"""Evaluation: AutoAttack-grade robust accuracy (`evaluate`), the sanity
checks for gradient masking, the run report and the export.

Library layer: takes plain arguments, never imports `advtrain.recipe` or
`advtrain.cli`.
"""

from advtrain.evaluation.robustness import evaluate

__all__ = ["evaluate"]
