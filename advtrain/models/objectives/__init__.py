"""Training objectives beyond the mixed clean/adversarial loss: TRADES and
GradAlign, each an `AdversarialModel` subclass.
"""
