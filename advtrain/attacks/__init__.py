"""Attacks: pure functions over a `model_fn`, and the `Attack` spec."""

from advtrain.attacks.apgd import apgd_ce, apgd_dlr
from advtrain.attacks.attack import (
    Attack,
    attack_settings,
    attacks,
    register_attack,
)
from advtrain.attacks.cleverhans_backend import cleverhans_fgsm, cleverhans_pgd
from advtrain.attacks.common import canonical_norm, per_example_cross_entropy
from advtrain.attacks.fab import fab_t
from advtrain.attacks.fgsm import fgsm, fgsm_random_start
from advtrain.attacks.pgd import pgd
from advtrain.attacks.square import square

__all__ = [
    "apgd_ce",
    "apgd_dlr",
    "Attack",
    "attack_settings",
    "attacks",
    "canonical_norm",
    "cleverhans_fgsm",
    "cleverhans_pgd",
    "fab_t",
    "fgsm",
    "fgsm_random_start",
    "per_example_cross_entropy",
    "pgd",
    "register_attack",
    "square",
]
