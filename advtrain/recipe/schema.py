"""The recipe's typed, strict schema: seven sections of plain values.

A recipe has seven sections (data, model, attack, train, runtime, eval,
output). Unknown keys, wrong types and out-of-range values are rejected with
one line that names the recipe file, the key's full path, what is allowed and
what was received.

Example:

```python
recipe = load_recipe("recipes/quickstart.yaml", ["train.epochs=2"])
recipe.attack.eps
```
"""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from advtrain.models.batchnorm.options import BatchNormOptions
from advtrain.train.options import PlanOptions, RuntimeOptions
from advtrain.utils.errors import BAD_INPUT, did_you_mean
from advtrain.utils.options import Options, Seed


class RecipeError(ValueError):
    """A recipe, override or CLI value that cannot be used (exit code 2)."""

    exit_code = BAD_INPUT


_NAME = re.compile(r"\w[\w.+=-]{0,99}")

# The recipe's sections share the library's strict option rules.
_Section = Options


def _as_tuple(value: Any) -> Any:
    # YAML has no tuples: [h, w] arrives as a list.
    return tuple(value) if isinstance(value, list) else value


Side = Annotated[int, Field(ge=1, le=16_384)]
Size = Annotated[tuple[Side, Side], BeforeValidator(_as_tuple)]


def _norm_text(data: Any) -> Any:
    """`norm: 2` and `norm: .inf` (YAML numbers) mean "2" and "inf"; any
    other number (2.5) becomes its text, for the norm's rule to refuse
    by value (a boolean is left for the type to refuse)."""
    if isinstance(data, dict) and "norm" in data:
        value = data["norm"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return data
        if value == 2:
            return {**data, "norm": "2"}
        if value == math.inf:
            return {**data, "norm": "inf"}
        return {**data, "norm": str(value)}
    return data


Fraction = Field(ge=0.0, le=1.0)


class AugmentConfig(_Section):
    """Augmentation applied on the input pipeline, never on the device."""

    random_crop_pad: int = Field(0, ge=0, le=64)
    brightness: float = Field(0.0, ge=0.0, le=1.0)
    contrast: float = Field(0.0, ge=0.0, le=1.0)
    # Off by default: some traffic signs change meaning when mirrored.
    horizontal_flip: bool = False


class DataConfig(_Section):
    """Where the examples come from and how they are fed."""

    # A registered data source (advtrain.data.register_source): digits,
    # mnist, gtsrb, arrays, folder, tfds, or one a plugin registers.
    source: str = "digits"
    # Directory (mnist IDX files, GTSRB manual dir, image folder, arrays
    # directory) or file prefix (arrays: PATH_x.npy / PATH_y.npy).
    path: Optional[str] = None
    tfds_name: Optional[str] = None
    # Where TFDS keeps prepared datasets (gtsrb, tfds, mnist without path);
    # None: $TFDS_DATA_DIR or ~/tensorflow_datasets.
    tfds_data_dir: Optional[str] = None
    # (height, width). gtsrb needs it: its images are 15..250 px, not square.
    image_size: Optional[Size] = None
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    limit_train: Optional[int] = Field(None, ge=1)
    limit_test: Optional[int] = Field(None, ge=1)
    shuffle_buffer: int = Field(10_000, ge=0)
    # "auto": in memory for sources of bounded size (digits, mnist, gtsrb),
    # none for those that may not fit (arrays, folder, tfds); or a file
    # path prefix for an on-disk cache.
    cache: Union[Literal["auto", "memory", "none"], str] = "auto"
    deterministic: bool = False
    roi_crop: bool = True
    on_corrupt: Literal["error", "skip"] = "error"
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    seed: Seed = 0

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        return _registered("data source", value)

    @model_validator(mode="after")
    def _positive_image_size(self) -> DataConfig:
        if self.image_size is not None and min(self.image_size) < 1:
            raise ValueError(
                "image_size must be [height, width] >= 1. "
                f"Received: image_size={list(self.image_size)}"
            )
        return self


def _registered(kind: str, value: str, extra: tuple[str, ...] = ()) -> str:
    """`value` if the registry of `kind` holds it (or it is in `extra`)."""
    if kind == "attack":
        from advtrain.attacks import attacks as registry
    elif kind == "data source":
        from advtrain.data.sources import sources as registry
    elif kind == "objective":
        from advtrain.models.objectives import objectives as registry
    else:
        from advtrain.backbones.registry import backbones as registry
    if value in extra or value in registry:
        return value
    known = sorted({*registry.names(), *extra})
    raise ValueError(
        f"unknown {kind} '{value}'.{did_you_mean(value, known)} Known: "
        f"{', '.join(known)} (a plugin module named in `plugins` can "
        "register more)"
    )


class BatchNormConfig(BatchNormOptions):
    __doc__ = BatchNormOptions.__doc__


class ModelConfig(_Section):
    """Classifier = input adapter -> preprocess -> backbone -> head."""

    backbone: str = "small_cnn"
    # "module:function" returning a keras.Model; runs code, see README.
    builder: Optional[str] = None
    # "imagenet" (Keras download/cache), a weights file (.weights.h5 of the
    # backbone or the whole classifier, or a Keras ImageNet .h5), or null.
    weights: Optional[str] = None
    # Side the backbone sees; None: native size, scaled up to the backbone's
    # minimum (its default size when pretrained weights are loaded).
    input_size: Optional[Size] = None
    # frozen: head only. top_k: the backbone's top_k layers that hold
    # weights, counted from the output, plus the head.
    freeze: Literal["all_trainable", "frozen", "top_k"] = "all_trainable"
    top_k: int = Field(0, ge=0)
    # Head-only epochs before the freeze policy applies, then the learning
    # rate is multiplied by finetune_lr_factor (advtrain.models.freezing).
    # Not train.warmup_epochs, the learning-rate warm-up.
    head_only_epochs: int = Field(0, ge=0)
    finetune_lr_factor: float = Field(0.1, gt=0.0, le=1.0)
    width: int = Field(32, ge=1, le=1024)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    batchnorm: BatchNormConfig = Field(default_factory=BatchNormConfig)

    @field_validator("backbone")
    @classmethod
    def _known_backbone(cls, value: str) -> str:
        return _registered("backbone", value)

    @model_validator(mode="after")
    def _top_k_needs_k(self) -> ModelConfig:
        if self.freeze == "top_k" and self.top_k < 1:
            raise ValueError("freeze: top_k needs top_k >= 1. Received: top_k=0")
        return self


class AttackConfig(_Section):
    """The training attack. Pixel space: eps is in units of [0, 1] pixels.

    Types only: the rules on the values (eps within the pixel range under
    norm inf, step sizes, counts, which method takes which setting) are
    the library's, applied when the recipe loads by building the `Attack`
    and checking the objective's arguments
    (`advtrain.recipe.build.check_attack_section`); an error names the key.
    """

    # none, or a registered attack (advtrain.attacks.register_attack):
    # fgsm, fgsm_rs, n_fgsm, zerograd, pgd, or one a plugin registers.
    method: str = "fgsm_rs"
    # Shared by every method: eps in pixel units, the norm (inf or 2), the
    # backend (advtrain, or cleverhans for fgsm and pgd).
    eps: float = 8 / 255
    norm: str = "inf"
    backend: str = "advtrain"
    # The method's own settings (`METHOD_KEYS`). Each applies to the
    # methods whose function takes it; set for another method it is an
    # error. null (the default): the method's own default
    # (advtrain.attacks.attack_settings).
    # fgsm_rs, n_fgsm, zerograd: the step; default 1.25 * eps (Wong et al.).
    alpha: Optional[float] = None
    # pgd: iterations (default 10), step size (default 2.5 * eps / steps)
    # and the random start (default true).
    steps: Optional[int] = None
    step_size: Optional[float] = None
    random_start: Optional[bool] = None
    # fgsm_rs, n_fgsm, zerograd: clip the random start to the pixel range
    # before its gradient is taken (default true; false: as drawn, like
    # Wong et al.'s MNIST code).
    clip_start: Optional[bool] = None
    # n_fgsm: radius of the random start; default 2 * eps (de Jorge et al.).
    noise: Optional[float] = None
    # zerograd: share of each example's smallest gradient entries zeroed
    # (default 0.35).
    zero_quantile: Optional[float] = None
    # The method's settings that have no key above, e.g. {rho: 0.5} for
    # apgd_ce or a plugin attack's.
    options: dict[str, Any] = Field(default_factory=dict)
    adv_weight: float = 0.5
    # inference or train: the mode the classifier runs in for the attack.
    mode: str = "inference"
    # The gradient-reusing step (AdversarialModel(reuse_gradient=)): the
    # clean training pass's own backward pass gives the attack's gradient
    # (2 forward + 2 backward passes). auto: exactly for plain fgsm with
    # 0 < adv_weight < 1 and the adversarial objective; true forces it
    # (fgsm or fgsm_rs); false: never.
    reuse_gradient: Union[bool, str] = "auto"
    # The training objective, a registered AdversarialModel subclass
    # (advtrain.register_objective): adversarial (the clean/adversarial
    # mix, adv_weight), trades (with method: pgd), grad_align, or one a
    # plugin registers.
    objective: str = "adversarial"
    # The objective's own keyword arguments, checked against its signature:
    # trades {beta: 6.0}; grad_align {grad_align: 0.2} (the penalty's
    # weight; about 3x the cost of an FGSM step).
    objective_options: dict[str, Any] = Field(default_factory=dict)
    # Training only: eps, alpha and step_size grow linearly from ~0 to their
    # values over this many epochs, step by step (advtrain.models.eps_ramp);
    # 0: full eps from the first step. Evaluation always uses the full eps.
    eps_ramp_epochs: float = Field(0.0, ge=0.0)

    @model_validator(mode="before")
    @classmethod
    def _norm_as_text(cls, data: Any) -> Any:
        return _norm_text(data)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return _registered("attack", value, extra=("none",))

    @model_validator(mode="after")
    def _method_defaults(self) -> AttackConfig:
        # A method key left null is the method's default, filled in here
        # so the resolved recipe states what runs. A key the method does
        # not take stays as written: the Attack refuses it if set.
        from advtrain.attacks.attack import attack_settings

        if self.method == "none":
            return self
        try:
            settings = attack_settings(self.method, self.backend) or {}
        except ValueError:  # not on this backend: the Attack says so
            return self
        for key in METHOD_KEYS:
            if getattr(self, key) is None and settings.get(key) is not None:
                self.__dict__[key] = settings[key]
        return self

    @field_validator("options")
    @classmethod
    def _options_not_keys(cls, value: dict) -> dict:
        # Which options the method takes is the Attack's rule (it names
        # the method and what it takes); a key of its own goes there.
        for name in value:
            if name in cls.model_fields and name != "options":
                raise ValueError(
                    f"'{name}' has a key of its own: set attack.{name}. "
                    f"Received: attack.options.{name}={value[name]!r}"
                )
        return value

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, value: str, info: ValidationInfo) -> str:
        from advtrain.models.objectives import objectives

        _registered("objective", value)
        method = info.data.get("method")
        needed = getattr(objectives.get(value), "attack_method", None)
        if value != "adversarial" and method == "none":
            raise ValueError(
                f"objective {value} needs a training attack. Received: "
                "attack.method=none"
            )
        if needed is not None and method is not None and method != needed:
            raise ValueError(
                f"objective {value} maximises its loss with method {needed}: set "
                f"attack.method: {needed}. Received: attack.method={method}"
            )
        return value

    @field_validator("objective_options")
    @classmethod
    def _objective_takes_options(cls, value: dict, info: ValidationInfo) -> dict:
        from advtrain.models.objectives import objective_options, objectives
        from advtrain.models.objectives.registry import RESERVED

        name = info.data.get("objective")
        if name is None:  # refused already
            return value
        accepted = objective_options(objectives.get(name))
        return _checked_options(
            f"objective '{name}'", value, accepted, RESERVED, "attack.objective_options"
        )


def without_untaken_keys(section: dict[str, Any]) -> dict[str, Any]:
    """An attack section without the method keys (`METHOD_KEYS`) its
    method does not take; as it is for a method taking `**kwargs` or one
    no registry holds (validation says so)."""
    from advtrain.attacks.attack import attack_settings

    method = section.get("method", "fgsm_rs")
    try:
        takes = (
            {}
            if method == "none"
            else attack_settings(method, section.get("backend", "advtrain"))
        )
    except (TypeError, ValueError):
        return section
    if takes is None:
        return section
    return {k: v for k, v in section.items() if k not in METHOD_KEYS or k in takes}


def _checked_options(owner: str, options: dict, accepted, reserved, key: str) -> dict:
    """`check_options` on the recipe key `key`, its TypeError as the
    ValueError pydantic reports."""
    from advtrain.utils.keywords import check_options

    try:
        return check_options(owner, options, accepted, reserved, received=key)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


# The attack section's keys that are one method's own settings (the rest
# are shared by every method, or arguments of the training model).
METHOD_KEYS = (
    "alpha", "steps", "step_size", "random_start", "clip_start", "noise",
    "zero_quantile",
)  # fmt: skip


class TrainConfig(PlanOptions):
    """`PlanOptions` (optimisation and batch arithmetic) and the
    catastrophic-overfitting guard (advtrain.train.guards)."""

    # Catastrophic-overfitting guard (advtrain.train.guards): after each epoch,
    # PGD (co_guard_pgd_steps, the training eps) on co_guard_examples fixed
    # training examples; a fall of more than co_guard_drop (absolute) below
    # the best epoch, or (in an epoch trained at full eps, after the eps
    # ramp) the training attack's accuracy more than co_guard_gap above
    # PGD's, restores the best epoch's weights, then stops or goes on.
    co_guard: bool = False
    co_guard_drop: float = Field(0.2, gt=0.0, le=1.0)
    co_guard_gap: Optional[float] = Field(0.5, gt=0.0, le=1.0)  # None: off
    co_guard_action: Literal["stop", "rollback"] = "rollback"
    co_guard_examples: int = Field(256, ge=1)
    co_guard_pgd_steps: int = Field(10, ge=1, le=1000)
    # At the end: keep the best epoch's weights when the last is worse
    # (early stopping on the PGD check), or the last epoch's.
    co_guard_keep: Literal["best", "last"] = "best"


class EvalConfig(_Section):
    batch_size: int = Field(256, ge=1)
    eps: Optional[float] = Field(None, ge=0.0, le=1.0)
    norm: Literal["inf", "2"] = "inf"
    fgsm: bool = True
    pgd_steps: int = Field(20, ge=0, le=10_000)
    pgd_step_size: Optional[float] = Field(None, gt=0.0)
    pgd_restarts: int = Field(1, ge=1, le=1000)
    # The attacks reported: a list of fgsm, pgd, apgd_ce, apgd_dlr, fab_t,
    # square and autoattack (AutoAttack's ensemble APGD-CE, APGD-T, FAB-T,
    # Square as a cascade), or autoattack alone. None: FGSM when `fgsm` is
    # true, PGD when pgd_steps > 0, and autoattack. Given, the list alone decides
    # (pgd uses the pgd_* settings). The headline robust_accuracy counts an
    # example robust only if clean and every attack get it right.
    attacks: Optional[
        Union[
            Literal["autoattack"],
            list[
                Literal[
                    "fgsm",
                    "pgd",
                    "apgd_ce",
                    "apgd_dlr",
                    "fab_t",
                    "square",
                    "autoattack",
                ]
            ],
        ]
    ] = None
    # AutoAttack's budget: standard (APGD 100 iterations, APGD-T and FAB-T
    # over 9 targets, Square 5,000 queries) or cheap (no FAB-T, Square 1,000
    # queries).
    budget: Literal["standard", "cheap"] = "standard"
    # Square's queries per example (default: the budget's), for the
    # ensemble and for a listed square.
    square_queries: Optional[int] = Field(None, ge=1, le=1_000_000)
    # APGD (Croce and Hein 2020) when listed on its own: iterations per
    # run, and random restarts; apgd_dlr is AutoAttack's targeted DLR over
    # the 9 most likely wrong classes, one run per target and restart.
    apgd_steps: int = Field(100, ge=1, le=10_000)
    apgd_restarts: int = Field(1, ge=1, le=1000)
    eps_sweep: list[float] = Field(default_factory=list)
    max_examples: Optional[int] = Field(None, ge=1)
    # Gradient-masking checks (advtrain.evaluation.sanity) on a seeded subset of this
    # many test examples; 0 skips them. They cost ~5 PGD runs per example.
    # The gradient-free check reads the evaluation itself and always runs.
    sanity_examples: int = Field(200, ge=0)
    seed: Seed = 0

    @model_validator(mode="before")
    @classmethod
    def _norm_as_text(cls, data: Any) -> Any:
        return _norm_text(data)

    @model_validator(mode="after")
    def _attacks_runnable(self) -> EvalConfig:
        if self.attacks is None or isinstance(self.attacks, str):
            return self
        repeated = sorted({a for a in self.attacks if self.attacks.count(a) > 1})
        if repeated:
            raise ValueError(
                "eval.attacks must name each attack once. "
                f"Received: repeated={repeated}"
            )
        if "pgd" in self.attacks and self.pgd_steps < 1:
            raise ValueError(
                "eval.attacks lists pgd, which needs eval.pgd_steps >= 1. "
                f"Received: pgd_steps={self.pgd_steps}"
            )
        return self

    @model_validator(mode="after")
    def _sweep_in_range(self) -> EvalConfig:
        for value in self.eps_sweep:
            if not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"eps_sweep values must be in [0, 1]. Received: {value}"
                )
        return self


class RuntimeConfig(RuntimeOptions):
    __doc__ = RuntimeOptions.__doc__
    # A recipe names its backend: the `advtrain` command starts Keras on it.
    backend: Literal["tensorflow", "jax"] = "tensorflow"


class OutputConfig(_Section):
    """The run folder, checkpoints (advtrain.train.checkpoint) and logs.

    checkpoint_every_epochs: checkpoint at the end of every N-th epoch.
    checkpoint_every_steps: also checkpoint inside an epoch, at the first
        host call at or after every N-th training step (exactly every N when
        runtime.steps_per_execution divides N). None: epoch ends only.
    keep_checkpoints: newest K checkpoints kept, plus the best one.
    monitor: the epoch metric that picks the best checkpoint; "auto" is
        robust accuracy: val_adv_accuracy when there is a validation split
        and the model attacks during validation, else adv_accuracy
        (accuracy under attack.method: none).
    monitor_mode: "max", "min", or "auto" (min for names ending in loss).
    """

    dir: Optional[str] = None
    checkpoint_every_epochs: int = Field(1, ge=1)
    checkpoint_every_steps: Optional[int] = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    monitor: str = Field("auto", pattern=r"^(auto|(val_)?[a-z][a-z0-9_]*)$")
    monitor_mode: Literal["auto", "max", "min"] = "auto"
    tensorboard: bool = True
    plots: bool = True
    # export/saved_model/: a TF Serving SavedModel (uint8 images in,
    # logits and probabilities out), see advtrain.evaluation.export.
    export_saved_model: bool = True


class Recipe(_Section):
    """A whole training run.

    plugins: Python modules imported before the rest of the recipe is
    checked, so the attacks, data sources and backbones they register can
    be named in it. Importing runs their code: the same trust as
    `model.builder`.
    """

    name: str = "run"
    description: str = ""
    plugins: list[str] = Field(default_factory=list)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @model_validator(mode="before")
    @classmethod
    def _import_plugins_first(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("plugins"):
            from advtrain.recipe.plugins import import_plugins

            import_plugins(data["plugins"])
        return data

    @model_validator(mode="after")
    def _tensorflow_only_output(self) -> Recipe:
        # A TF Serving SavedModel needs TensorFlow's tracing: off by default
        # on JAX (the resolved recipe says so), refused when asked for.
        # TensorBoard's logs need tf.summary: off where TensorFlow is not
        # installed (the resolved recipe says so), as the recipes ask for
        # them.
        output = self.output
        if self.runtime.backend != "tensorflow" and output.export_saved_model:
            if "export_saved_model" in output.model_fields_set:
                raise ValueError(
                    "output.export_saved_model: the SavedModel export runs on "
                    "TensorFlow only; set it false or runtime.backend: "
                    "tensorflow (model.keras loads on every backend). Received: "
                    "output.export_saved_model=true, runtime.backend=jax"
                )
            output.export_saved_model = False
        if importlib.util.find_spec("tensorflow") is None:
            output.tensorboard = False
        return self

    @field_validator("name")
    @classmethod
    def _name_not_path(cls, value: str) -> str:
        # The run folder is runs/NAME-TIMESTAMP: a name must not leave runs/.
        if not _NAME.fullmatch(value):
            raise ValueError(
                "name must be 1-100 letters, digits, '_', '.', '+', '=' or "
                "'-', starting with a letter or digit (it names the run "
                "folder, so no '/' or '..')"
            )
        return value

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe: every key with its value; in the attack
        section, the method's own keys with the values the attack runs
        with, and no key the method does not take."""
        data = self.model_dump(mode="json")
        # A valid recipe's untaken method keys are all null: left out.
        data["attack"] = without_untaken_keys(data["attack"])
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
