"""Evaluation: AutoAttack-grade robust accuracy (`evaluate`), the
gradient-masking sanity checks, the run report and the export."""

from advtrain.evaluation.robustness import evaluate

__all__ = ["evaluate"]
