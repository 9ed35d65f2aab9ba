"""Models: the classifier, AdversarialModel and research subclasses."""

from advtrain.models import layers  # noqa: F401  (registers serializable layers)
from advtrain.models.adversarial import AdversarialModel
from advtrain.models.trades import TRADES

__all__ = ["AdversarialModel", "TRADES"]
