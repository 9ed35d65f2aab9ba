"""Models: the classifier, AdversarialModel and research subclasses.

Importing this package registers every advtrain Keras object that a saved
model can hold (the layers in `layers`, `FusedBatchNormalization`,
`AdversarialModel`, `TRADES`, `GradAlign`).
"""

from advtrain.models import (  # noqa: F401  (register serializable layers)
    fused_batchnorm,
    layers,
)
from advtrain.models.adversarial import AdversarialModel
from advtrain.models.grad_align import GradAlign
from advtrain.models.trades import TRADES

__all__ = ["AdversarialModel", "GradAlign", "TRADES"]
