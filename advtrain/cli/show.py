"""`advtrain show`: what a recipe would run, computed by the setup
`advtrain run` uses (`advtrain.recipe.run.recipe_setup`), writing and
downloading nothing (pretrained weights are left out at the size they set;
unprepared TFDS data is named).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

import keras

from advtrain.recipe.schema import DataConfig, Recipe
from advtrain.utils.progress import Echo

# Fractions of a phase at which its learning rate is shown.
_SCHEDULE_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def show(recipe: Recipe, *, echo: Echo = print) -> None:
    """Prints what `advtrain run` would do with `recipe`; refuses what
    `run` would refuse."""
    from advtrain.models.weights import is_pretrained_name
    from advtrain.recipe.build import recipe_runtime, recipe_splits
    from advtrain.recipe.run import recipe_setup

    echo("resolved recipe:")
    echo("\n".join(f"  {line}" for line in recipe.to_yaml().rstrip().splitlines()))
    pending = unprepared_data(recipe.data)
    if pending:
        echo(f"data: {pending}; model, batch plan and schedule need it.")
        return
    splits = recipe_splits(recipe)
    shape = "x".join(map(str, splits.image_shape))
    echo(
        f"data: {recipe.data.source}, {splits.train_size} train / "
        f"{splits.val_size} val / {splits.test_size} test, image {shape}, "
        f"{splits.num_classes} classes"
    )
    # The run's own setup (runtime and plan printed), without downloads.
    runtime = recipe_runtime(recipe)
    setup = recipe_setup(_without_downloads(recipe, splits), splits, runtime, echo)
    classifier, plan = setup.classifier, setup.plan
    echo(f"model: {adapter_chain(classifier)}")
    weights = recipe.model.weights
    if weights is None:
        echo("  weights: none (random initialisation)")
    elif is_pretrained_name(weights):
        echo(f"  weights: {weights} (fetched by `advtrain run`, not by show)")
    else:
        found = "present" if Path(weights).expanduser().is_file() else "MISSING"
        echo(f"  weights: {weights} (file {found}; loaded by `advtrain run`)")
    trainable = sum(int(keras.ops.size(w)) for w in classifier.trainable_weights)
    total = sum(int(keras.ops.size(w)) for w in classifier.weights)
    echo(f"  parameters: {total:,} ({trainable:,} trainable before freezing)")
    for line in schedule_lines(recipe, plan):
        echo(line)


def adapter_chain(classifier: keras.Model) -> str:
    """`pixels 28x28x1 -> gray->3ch -> resize ... -> backbone X -> head`."""
    from advtrain.models.classifier import classifier_head, describe

    shape = "x".join(str(d) for d in classifier.input_shape[1:])
    parts = [f"pixels {shape}"]
    body = describe(classifier)
    if body:
        parts.append(body)
    head = [layer.name for layer in classifier_head(classifier)]
    if head:
        logits = classifier.output_shape[-1]
        parts.append(f"head ({', '.join(head)}: {logits})")
    return " -> ".join(parts)


def _without_downloads(recipe: Recipe, splits) -> Recipe:
    # The recipe without its weights, at the input size they would set.
    from advtrain.models.classifier import backbone_input_size

    cfg = recipe.model
    if cfg.weights is None or cfg.builder:
        return recipe
    height, width, _ = splits.image_shape
    size = backbone_input_size(
        cfg.backbone, height, width, input_size=cfg.input_size, weights=cfg.weights
    )
    model = cfg.model_copy(update={"weights": None, "input_size": size})
    return recipe.model_copy(update={"model": model})


def schedule_lines(recipe: Recipe, plan) -> list[str]:
    """Each phase and its learning rate at a few steps (each phase's
    fresh optimizer starts its schedule over)."""
    from advtrain.recipe.build import recipe_optimizer, recipe_phases

    lines = []
    spe = plan.steps_per_epoch
    for phase in recipe_phases(recipe, plan.epochs):
        if phase.epochs <= 0:
            continue
        rate = _schedule(recipe_optimizer(recipe, plan, phase.lr_factor))
        steps = phase.epochs * spe
        points = sorted({int(round(f * (steps - 1))) for f in _SCHEDULE_POINTS})
        values = ", ".join(
            f"{rate(step):.3g} @ {phase.start_epoch * spe + step}" for step in points
        )
        lines.append(
            f"phase {phase.name}: epochs {phase.start_epoch + 1}-"
            f"{phase.end_epoch} ({steps} steps), freeze={phase.freeze}, "
            f"BatchNorm {'trained' if phase.bn_trainable else 'frozen'}, "
            f"{recipe.train.optimizer} lr x{phase.lr_factor:g}"
        )
        lines.append(f"  learning rate ({recipe.train.lr_schedule}): {values}")
    return lines


def _schedule(optimizer: keras.optimizers.Optimizer) -> Callable[[int], float]:
    config = optimizer.get_config()["learning_rate"]
    if isinstance(config, (int, float)):
        return lambda step: float(config)
    schedule = keras.optimizers.schedules.deserialize(config)
    return lambda step: float(schedule(step))


def unprepared_data(cfg: DataConfig) -> Optional[str]:
    """Why the recipe's data cannot be read without writing (a TFDS data
    set not prepared yet), or None."""
    if cfg.source == "gtsrb" and cfg.image_size is not None:
        name = "gtsrb"
    elif cfg.source == "tfds" and cfg.tfds_name:
        name = cfg.tfds_name
    elif cfg.source == "mnist" and cfg.path is None:
        name = "mnist"
    else:
        return None
    import tensorflow_datasets as tfds

    import advtrain.data  # noqa: F401  (registers the gtsrb builder)

    kwargs = {}
    if name == "gtsrb":
        from advtrain.data.gtsrb import gtsrb_config

        kwargs = {
            "config": gtsrb_config(cfg.roi_crop, cfg.image_size),
            "on_corrupt": cfg.on_corrupt,
        }
    try:
        builder = tfds.builder(name, data_dir=cfg.tfds_data_dir, **kwargs)
    except tfds.core.registered.DatasetNotFoundError:
        return None  # load_splits names the problem
    if builder.is_prepared():
        return None
    return (
        f"{name} is not prepared in {builder.data_dir} yet (`advtrain run` "
        "prepares it; show writes nothing)"
    )
