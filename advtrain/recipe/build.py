"""The recipe turned into the library's keyword arguments: the one place
recipe keys meet library arguments (data, runtime, batch plan, phases,
optimizer, attack, training model, evaluation).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import keras

from advtrain.attacks import Attack, make_attack
from advtrain.recipe.schema import AttackConfig, Recipe
from advtrain.utils.progress import Echo


def attack_from_config(cfg: AttackConfig) -> Optional[Attack]:
    """The training attack a recipe's attack section describes (None for
    `method: none`; TRADES's is PGD)."""
    from advtrain.attacks.attack import OPTION_KEYS

    return make_attack(cfg.method, **_keys(cfg, *OPTION_KEYS))


def _keys(section, *names: str) -> dict[str, Any]:
    """The recipe keys `names` of `section`, as keyword arguments."""
    return section.model_dump(include=set(names))


def recipe_splits(recipe: Recipe):
    """`load_splits` with the recipe's data keys."""
    from advtrain.data import LOAD_OPTIONS, load_splits

    return load_splits(recipe.data.source, **_keys(recipe.data, *LOAD_OPTIONS))


def recipe_runtime(recipe: Recipe):
    """`make_runtime` with the recipe's runtime keys."""
    from advtrain.train.runtime import make_runtime

    return make_runtime(**recipe.runtime.model_dump())


def recipe_plan(recipe: Recipe, runtime, train_size: int):
    """`plan_batches` with the recipe's train keys."""
    from advtrain.train.runtime import PLAN_KEYS, plan_batches

    return plan_batches(runtime, train_size, **_keys(recipe.train, *PLAN_KEYS))


def recipe_phases(recipe: Recipe, epochs: int) -> list:
    """`phases` with the recipe's model keys."""
    from advtrain.models.freezing import phases

    return phases(
        epochs,
        **_keys(recipe.model, *_PHASE_KEYS),
        bn_trainable=recipe.model.batchnorm.trainable,
    )


def recipe_optimizer(recipe: Recipe, plan, lr_factor: float = 1.0):
    """`make_optimizer` for a phase whose learning rate is `lr_factor` x
    the plan's."""
    from advtrain.train.runtime import OPTIMIZER_KEYS, make_optimizer

    phase_plan = dataclasses.replace(plan, learning_rate=plan.learning_rate * lr_factor)
    return make_optimizer(phase_plan, **_keys(recipe.train, *OPTIMIZER_KEYS))


# The model keys of `phases`.
_PHASE_KEYS = ("head_only_epochs", "freeze", "top_k", "finetune_lr_factor")


def input_options(recipe: Recipe, training: bool = False) -> dict[str, Any]:
    """`make_input`'s data keys (`advtrain.data.INPUT_OPTIONS`)."""
    from advtrain.data import INPUT_OPTIONS

    options = _keys(recipe.data, *INPUT_OPTIONS)
    if training and recipe.runtime.deterministic:
        # A resumed run replays its batches only if tf.data's order is fixed.
        options["deterministic"] = True
    return options


def build_training_model(
    recipe: Recipe, classifier: keras.Model, steps_per_epoch: Optional[int] = None
) -> keras.Model:
    """AdversarialModel (or TRADES, GradAlign) around `classifier` per the recipe.
    `steps_per_epoch` turns `attack.eps_ramp_epochs` into steps (without
    it there is no ramp)."""
    from advtrain.models.adversarial import AdversarialModel
    from advtrain.models.objectives.grad_align import GradAlign
    from advtrain.models.objectives.trades import TRADES

    cfg = recipe.attack
    attack = attack_from_config(cfg)
    ramp = 0
    if attack is not None and cfg.eps_ramp_epochs and steps_per_epoch:
        ramp = max(1, round(cfg.eps_ramp_epochs * steps_per_epoch))
    if cfg.method == "trades":
        return TRADES(
            classifier,
            attack,
            beta=cfg.beta,
            attack_mode=cfg.mode,
            seed=recipe.train.seed,
            eps_ramp_steps=ramp,
            **_RECIPE_OWNS_BATCHNORM,
        )
    extra = {"grad_align": cfg.grad_align} if cfg.grad_align else {}
    return (GradAlign if cfg.grad_align else AdversarialModel)(
        classifier,
        attack,
        **extra,
        adv_weight=cfg.adv_weight if attack is not None else 0.0,
        attack_mode=cfg.mode,
        seed=recipe.train.seed,
        fused=cfg.fused_step if attack is not None else False,
        eps_ramp_steps=ramp,
        **_RECIPE_OWNS_BATCHNORM,
    )


# `model.batchnorm` (fused kernel, momentum for the whole run) is applied by
# `build_run_model`; a fit-time policy would see one phase, not the run.
_RECIPE_OWNS_BATCHNORM = {"fused_batchnorm": False, "batchnorm_momentum": None}


def build_run_model(
    recipe: Recipe,
    splits,
    total_steps: Optional[int] = None,
    steps_per_epoch: Optional[int] = None,
) -> tuple[keras.Model, keras.Model]:
    """The classifier (backbone or `model.builder`, BatchNorm policy
    applied) and the training model around it, as `run` and `profile`
    build them. Call it inside the runtime's strategy scope.
    `total_steps` (epochs x steps per epoch) sets `momentum: auto`;
    `steps_per_epoch` sets the length of `attack.eps_ramp_epochs`.
    """
    from advtrain.models.batchnorm.policy import apply_batchnorm_policy
    from advtrain.models.classifier import build_classifier

    if recipe.model.builder:
        from advtrain.train.fitting import build_from_builder

        classifier = build_from_builder(
            recipe.model.builder,
            splits.image_shape,
            splits.num_classes,
            recipe.model,
        )
    else:
        classifier = build_classifier(
            splits.image_shape,
            splits.num_classes,
            **_keys(
                recipe.model, "backbone", "weights", "input_size", "width", "dropout"
            ),
        )
    apply_batchnorm_policy(
        classifier,
        total_steps=total_steps,
        **_keys(recipe.model.batchnorm, "momentum", "fused_kernel"),
    )
    return classifier, build_training_model(recipe, classifier, steps_per_epoch)


def evaluation_keys(recipe: Recipe) -> dict[str, Any]:
    """`evaluate_robustness`'s keyword arguments from the recipe."""
    keys = recipe.eval.model_dump(exclude={"sanity_examples"})
    return {**keys, "default_eps": recipe.attack.eps}


def recipe_sanity_checks(
    classifier, test_ds, recipe: Recipe, echo: Echo, strategy=None, evaluation=None
):
    from advtrain.evaluation.sanity import (
        format_sanity_checks,
        masking_check,
        run_sanity_checks,
    )

    cfg = recipe.eval
    checks = []
    if cfg.sanity_examples > 0:
        checks = run_sanity_checks(
            classifier,
            test_ds,
            default_eps=recipe.attack.eps,
            eps=cfg.eps,
            norm=cfg.norm,
            pgd_steps=cfg.pgd_steps,
            pgd_step_size=cfg.pgd_step_size,
            pgd_restarts=cfg.pgd_restarts,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            max_examples=cfg.sanity_examples,
            strategy=strategy,
        )
    # Free: it reads the evaluation's own cascade, so it runs even when the
    # PGD-based checks are off (sanity_examples: 0).
    masking = masking_check(evaluation or {})
    if masking is not None:
        checks.append(masking)
    if checks:
        echo(format_sanity_checks(checks))
    return checks
