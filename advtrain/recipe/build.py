"""The recipe turned into the library's keyword arguments: the one place
recipe keys meet library arguments."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Optional

import keras

from advtrain.attacks import Attack
from advtrain.recipe.keys import recipe_keys
from advtrain.recipe.schema import (
    METHOD_KEYS,
    AttackConfig,
    ModelConfig,
    Recipe,
    RecipeError,
)
from advtrain.utils.errors import one_line
from advtrain.utils.progress import Echo


def attack_from_config(cfg: AttackConfig) -> Optional[Attack]:
    """The attack section's `Attack` (None for `method: none`); what the
    `Attack` refuses is a RecipeError naming the key."""
    own = {k: v for k, v in _keys(cfg, *METHOD_KEYS).items() if v is not None}
    options = {k: f"attack.options.{k}" for k in cfg.options}
    if cfg.method == "none":
        return None
    with recipe_keys("attack", **options):
        shared = _keys(cfg, "method", "eps", "norm", "backend")
        return Attack.from_config({**shared, **own, "options": cfg.options})


def check_attack_section(recipe: Recipe) -> None:
    """Applies the library's rules to the attack section once, when the
    recipe loads: builds the `Attack` and checks the objective's arguments
    (`build_training_model` then trusts it); a refusal names the key."""
    from advtrain.models.objectives import objectives

    cfg = recipe.attack
    attack = attack_from_config(cfg)
    ramp = 1 if cfg.eps_ramp_epochs else 0  # its length is the data's
    with recipe_keys("attack", **_MODEL_KEYS):
        objectives.get(cfg.objective).check_arguments(
            attack, **_model_arguments(cfg, attack, ramp)
        )


# The training model's arguments whose recipe keys have other names.
_MODEL_KEYS = {
    "attack": "attack.method",
    "attack_mode": "attack.mode",
    "reuse_gradient": "attack.reuse_gradient",
    "eps_ramp_steps": "attack.eps_ramp_epochs",
}


def _model_arguments(cfg: AttackConfig, attack, ramp: int) -> dict[str, Any]:
    return {
        "adv_weight": cfg.adv_weight if attack is not None else 0.0,
        "attack_mode": cfg.mode,
        "reuse_gradient": cfg.reuse_gradient,
        "eps_ramp_steps": ramp,
    }


def _keys(section, *names: str) -> dict[str, Any]:
    return section.model_dump(include=set(names))


def recipe_splits(recipe: Recipe):
    from advtrain.data import LOAD_OPTIONS, load_splits

    with recipe_keys("data"):
        return load_splits(recipe.data.source, **_keys(recipe.data, *LOAD_OPTIONS))


def recipe_runtime(recipe: Recipe):
    from advtrain.train.runtime import make_runtime

    with recipe_keys("runtime"):
        return make_runtime(**recipe.runtime.model_dump())


def recipe_plan(recipe: Recipe, runtime, train_size: int):
    from advtrain.train.runtime import PLAN_KEYS, plan_batches

    with recipe_keys("train"):
        return plan_batches(runtime, train_size, **_keys(recipe.train, *PLAN_KEYS))


def recipe_phases(recipe: Recipe, epochs: int) -> list:
    from advtrain.models.freezing import phases

    return phases(
        epochs,
        **_keys(recipe.model, *_PHASE_KEYS),
        bn_trainable=recipe.model.batchnorm.trainable,
    )


def recipe_optimizer(recipe: Recipe, plan, lr_factor: float = 1.0):
    """`make_optimizer` at `lr_factor` x the plan's learning rate."""
    from advtrain.train.runtime import OPTIMIZER_KEYS, make_optimizer

    phase_plan = dataclasses.replace(plan, learning_rate=plan.learning_rate * lr_factor)
    return make_optimizer(phase_plan, **_keys(recipe.train, *OPTIMIZER_KEYS))


_PHASE_KEYS = ("head_only_epochs", "freeze", "top_k", "finetune_lr_factor")
_CLASSIFIER_KEYS = ("backbone", "weights", "input_size", "width", "dropout")


def input_options(recipe: Recipe, training: bool = False) -> dict[str, Any]:
    """`make_input`'s data keys."""
    from advtrain.data import INPUT_OPTIONS

    options = _keys(recipe.data, *INPUT_OPTIONS)
    if not recipe.train.shuffle:  # the recipe's stream shuffles in tf.data
        options["shuffle_buffer"] = 0
    if training and recipe.runtime.deterministic:
        # A resumed run replays its batches only if tf.data's order is fixed.
        options["deterministic"] = True
    return options


def build_training_model(
    recipe: Recipe, classifier: keras.Model, steps_per_epoch: Optional[int] = None
) -> keras.Model:
    """The objective `attack.objective` around `classifier`, with
    `attack.objective_options`; `steps_per_epoch` turns
    `attack.eps_ramp_epochs` into steps (without it, no ramp)."""
    from advtrain.train.fitting import training_model

    cfg = recipe.attack
    attack_from_config(cfg)  # a refusal names the key
    try:
        return training_model(
            classifier,
            cfg,
            seed=recipe.train.seed,
            steps_per_epoch=steps_per_epoch,
            fused_batchnorm=recipe.model.batchnorm.fused_kernel,
        )
    except (TypeError, ValueError) as exc:
        raise RecipeError(
            f"attack.objective: {cfg.objective}: {one_line(exc)}"
        ) from None


def recipe_classifier(recipe: Recipe, splits) -> keras.Model:
    """The model section's classifier ([0, 1] pixels in, logits out), as
    built: `model.builder`'s, or backbone, adapters and head."""
    from advtrain.models.classifier import build_classifier

    if recipe.model.builder:
        return build_from_builder(
            recipe.model.builder, splits.image_shape, splits.num_classes, recipe.model
        )
    with recipe_keys("model"):
        return build_classifier(
            splits.image_shape,
            splits.num_classes,
            **_keys(recipe.model, *_CLASSIFIER_KEYS),
        )


def recipe_evaluation(
    recipe: Recipe, classifier: keras.Model, splits, return_examples: Any = False
) -> tuple[Any, dict[str, Any], Any]:
    """`advtrain.evaluate` on the test split with the eval keys: the test
    batches, the metrics and the adversarial examples (or None)."""
    from advtrain.data import make_input
    from advtrain.evaluation.robustness import evaluate

    options = input_options(recipe)
    test_ds = make_input(
        splits.test, batch_size=recipe.eval.batch_size, training=False, **options
    )
    keys = recipe.eval.model_dump(exclude={"sanity_examples"})
    if keys["eps"] is None:
        keys["eps"] = recipe.attack.eps
    metrics = evaluate(
        classifier,
        test_ds,
        **keys,
        num_classes=splits.num_classes,
        return_examples=return_examples,
    )
    return test_ds, metrics, metrics.pop("adversarial_examples", None)


_SANITY_KEYS = (
    "eps",
    "norm",
    "pgd_steps",
    "pgd_step_size",
    "pgd_restarts",
    "seed",
    "batch_size",
)


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
            **_keys(cfg, *_SANITY_KEYS),
            max_examples=cfg.sanity_examples,
            strategy=strategy,
        )
    # Free (it reads the evaluation's cascade): runs even with no examples.
    masking = masking_check(evaluation or {})
    if masking is not None:
        checks.append(masking)
    if checks:
        echo(format_sanity_checks(checks))
    return checks


def load_builder(spec: str, key: str = "model.builder") -> Callable:
    """Imports "package.module:function"; a failure is one line naming `key`."""
    parts = spec.split(":") if isinstance(spec, str) else []
    module_name, attr = (p.strip() for p in parts) if len(parts) == 2 else ("", "")
    if not module_name or not attr:
        raise ValueError(
            f"{key}: expected 'package.module:function'. Received: {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the recipe's
        raise ValueError(
            f"{key}: cannot import module '{module_name}' "
            f"({type(exc).__name__}: {one_line(exc)}). Received: {spec!r}"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(
                f"{key}: module '{module_name}' has no attribute '{attr}'. "
                f"Received: {spec!r}"
            )
    if not callable(fn):
        raise TypeError(f"{key}: '{attr}' is not callable. Received: {spec!r}")
    return fn


def build_from_builder(
    spec: str,
    image_shape: tuple[int, ...],
    num_classes: int,
    cfg: ModelConfig,
) -> keras.Model:
    """The model `model.builder` returns: `fn(image_shape, num_classes,
    model_cfg)`, or `fn()` when it takes no parameters; a `keras.Model` from
    [0, 1] pixels to `num_classes` logits (nothing added)."""
    fn = load_builder(spec)
    unsupported = {
        "freeze": cfg.freeze != "all_trainable",
        "head_only_epochs": cfg.head_only_epochs > 0,
        "weights": cfg.weights is not None,
    }
    for key, used in unsupported.items():
        if used:
            raise ValueError(
                f"model.{key}: applies to advtrain's backbones, not to a "
                f"model.builder model (it trains whole; load weights in the "
                f"builder). Received: {key}={getattr(cfg, key)!r}"
            )
    try:
        required = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        required = [None]
    args = (tuple(image_shape), int(num_classes), cfg) if required else ()
    model = fn(*args)
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"model.builder: {spec} must return a keras.Model. "
            f"Received: {type(model).__name__}"
        )
    out = model.outputs[0].shape if getattr(model, "outputs", None) else None
    if out is not None and out[-1] != num_classes:
        raise ValueError(
            f"model.builder: {spec} returns {out[-1]} outputs; the data has "
            f"{num_classes} classes. Received: output shape {tuple(out)}"
        )
    return model
