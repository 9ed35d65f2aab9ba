"""Models: the classifier, AdversarialModel and research subclasses.

Importing this package registers every advtrain Keras object that a saved
model can hold (the layers in `layers`, `FusedBatchNormalization`,
`AdversarialModel`, `TRADES`, `GradAlign`).
"""

from advtrain.models import layers  # noqa: F401  (registers serializable layers)
from advtrain.models.adversarial import AdversarialModel
from advtrain.models.batchnorm import fused  # noqa: F401  (FusedBatchNormalization)
from advtrain.models.objectives.grad_align import GradAlign
from advtrain.models.objectives.trades import TRADES

__all__ = ["AdversarialModel", "GradAlign", "TRADES"]
