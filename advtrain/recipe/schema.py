"""The recipe's strict schema: seven sections (data, model, attack, train,
runtime, eval, output) of plain values; docs/recipes.md describes each key.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from advtrain import backend
from advtrain.models.batchnorm.options import BatchNormOptions
from advtrain.train.options import CheckpointOptions, PlanOptions, RuntimeOptions
from advtrain.utils.errors import BAD_INPUT, did_you_mean, one_line
from advtrain.utils.options import Options, Seed


class RecipeError(ValueError):
    """A recipe, override or CLI value that cannot be used (exit code 2)."""

    exit_code = BAD_INPUT


_NAME = re.compile(r"\w[\w.+=-]{0,99}")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _as_tuple(value: Any) -> Any:
    # YAML has no tuples: [h, w] arrives as a list.
    return tuple(value) if isinstance(value, list) else value


Side = Annotated[int, Field(ge=1, le=16_384)]
Size = Annotated[tuple[Side, Side], BeforeValidator(_as_tuple)]


def _norm_text(value: Any) -> Any:
    # YAML numbers as norms: 2 and .inf mean "2" and "inf"; another number
    # becomes its text, for the norm's rule to refuse.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return "2" if value == 2 else "inf" if value == math.inf else str(value)


Norm = BeforeValidator(_norm_text)


class AugmentConfig(Options):
    """Augmentation applied on the input pipeline, never on the device."""

    random_crop_pad: int = Field(0, ge=0, le=64)
    brightness: float = Field(0.0, ge=0.0, le=1.0)
    contrast: float = Field(0.0, ge=0.0, le=1.0)
    # Off by default: some traffic signs change meaning when mirrored.
    horizontal_flip: bool = False


class DataConfig(Options):
    """Where the examples come from and how they are fed."""

    source: str = "digits"  # a registered data source
    path: Optional[str] = None  # a folder, or arrays' PATH_x.npy prefix
    tfds_name: Optional[str] = None
    tfds_data_dir: Optional[str] = None  # None: $TFDS_DATA_DIR or ~/...
    image_size: Optional[Size] = None
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    limit_train: Optional[int] = Field(None, ge=1)
    limit_test: Optional[int] = Field(None, ge=1)
    shuffle_buffer: int = Field(10_000, ge=0)
    # auto: memory for sources of bounded size, else none; or a file prefix.
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


def _registered(kind: str, value: str, extra: tuple[str, ...] = ()) -> str:
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


class ModelConfig(Options):
    """Classifier = input adapter -> preprocess -> backbone -> head."""

    backbone: str = "small_cnn"
    builder: Optional[str] = None  # "module:function"; runs code
    weights: Optional[str] = None  # "imagenet", a weights file, or null
    input_size: Optional[Size] = None  # None: native, up to the minimum
    freeze: Literal["all_trainable", "frozen", "top_k"] = "all_trainable"
    top_k: int = Field(0, ge=0)
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


class AttackConfig(Options):
    """The training attack, in pixel units. Types only: the values' rules
    are the library's, applied at load (`build.check_attack_section`)."""

    method: str = "fgsm_rs"  # none, or a registered attack
    eps: float = 8 / 255
    norm: Annotated[str, Norm] = "inf"
    backend: str = "advtrain"  # or cleverhans (fgsm, pgd)
    # The method's own settings (`METHOD_KEYS`); null: the method's
    # default; set for a method that does not take it: an error.
    alpha: Optional[float] = None
    steps: Optional[int] = None
    step_size: Optional[float] = None
    random_start: Optional[bool] = None
    clip_start: Optional[bool] = None
    noise: Optional[float] = None
    zero_quantile: Optional[float] = None
    options: dict[str, Any] = Field(default_factory=dict)  # settings w/o a key
    adv_weight: float = 0.5
    mode: str = "inference"  # the classifier's mode while attacked
    reuse_gradient: Union[bool, str] = "auto"
    objective: str = "adversarial"  # a registered objective
    objective_options: dict[str, Any] = Field(default_factory=dict)
    eps_ramp_epochs: float = Field(0.0, ge=0.0)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        return _registered("attack", value, extra=("none",))

    @model_validator(mode="after")
    def _method_defaults(self) -> AttackConfig:
        # The resolved recipe states the method's defaults.
        settings = _method_settings(self.method, self.backend) or {}
        for key in METHOD_KEYS:
            if getattr(self, key) is None and settings.get(key) is not None:
                self.__dict__[key] = settings[key]
        return self

    @field_validator("options")
    @classmethod
    def _options_not_keys(cls, value: dict) -> dict:
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
        from advtrain.utils.keywords import check_options

        name = info.data.get("objective")
        if name is None:  # refused already
            return value
        accepted = objective_options(objectives.get(name))
        try:
            return check_options(
                f"objective '{name}'",
                value,
                accepted,
                RESERVED,
                received="attack.objective_options",
            )
        except TypeError as exc:  # pydantic reports ValueErrors
            raise ValueError(str(exc)) from None


def without_untaken_keys(section: dict[str, Any]) -> dict[str, Any]:
    """An attack section without the `METHOD_KEYS` its method does not take
    (unchanged for a method taking `**kwargs` or an unknown one)."""
    method = section.get("method", "fgsm_rs")
    takes = _method_settings(method, section.get("backend", "advtrain"))
    if takes is None:
        return section
    return {k: v for k, v in section.items() if k not in METHOD_KEYS or k in takes}


def _method_settings(method: str, backend: str) -> Optional[dict[str, Any]]:
    # None: the method takes **kwargs, or is unknown here (the Attack says so).
    from advtrain.attacks.attack import attack_settings

    if method == "none":
        return {}
    try:
        return attack_settings(method, backend)
    except (TypeError, ValueError):
        return None


# The attack keys that are one method's own settings.
METHOD_KEYS = (
    "alpha",
    "steps",
    "step_size",
    "random_start",
    "clip_start",
    "noise",
    "zero_quantile",
)


class TrainConfig(PlanOptions):
    """`PlanOptions` and the catastrophic-overfitting guard
    (advtrain.train.guards)."""

    co_guard: bool = False
    co_guard_drop: float = Field(0.2, gt=0.0, le=1.0)
    co_guard_gap: Optional[float] = Field(0.5, gt=0.0, le=1.0)  # None: off
    co_guard_action: Literal["stop", "rollback"] = "rollback"
    co_guard_examples: int = Field(256, ge=1)
    co_guard_pgd_steps: int = Field(10, ge=1, le=1000)
    co_guard_keep: Literal["best", "last"] = "best"


_EvalAttack = Literal[
    "fgsm", "pgd", "apgd_ce", "apgd_dlr", "fab_t", "square", "autoattack"
]


class EvalConfig(Options):
    batch_size: int = Field(256, ge=1)
    eps: Optional[float] = Field(None, ge=0.0, le=1.0)
    norm: Annotated[Literal["inf", "2"], Norm] = "inf"
    fgsm: bool = True
    pgd_steps: int = Field(20, ge=0, le=10_000)
    pgd_step_size: Optional[float] = Field(None, gt=0.0)
    pgd_restarts: int = Field(1, ge=1, le=1000)
    # None: fgsm if `fgsm`, pgd if pgd_steps > 0, and autoattack.
    attacks: Optional[Union[Literal["autoattack"], list[_EvalAttack]]] = None
    budget: Literal["standard", "cheap"] = "standard"
    square_queries: Optional[int] = Field(None, ge=1, le=1_000_000)
    apgd_steps: int = Field(100, ge=1, le=10_000)
    apgd_restarts: int = Field(1, ge=1, le=1000)
    eps_sweep: list[float] = Field(default_factory=list)
    max_examples: Optional[int] = Field(None, ge=1)
    # Gradient-masking checks on this many examples; 0 skips them (the
    # gradient-free check reads the evaluation and always runs).
    sanity_examples: int = Field(200, ge=0)
    seed: Seed = 0

    @model_validator(mode="after")
    def _runnable(self) -> EvalConfig:
        listed = self.attacks if isinstance(self.attacks, list) else []
        repeated = sorted({a for a in listed if listed.count(a) > 1})
        if repeated:
            raise ValueError(
                "eval.attacks must name each attack once. "
                f"Received: repeated={repeated}"
            )
        if "pgd" in listed and self.pgd_steps < 1:
            raise ValueError(
                "eval.attacks lists pgd, which needs eval.pgd_steps >= 1. "
                f"Received: pgd_steps={self.pgd_steps}"
            )
        for value in self.eps_sweep:
            if not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"eps_sweep values must be in [0, 1]. Received: {value}"
                )
        return self


class RuntimeConfig(RuntimeOptions):
    __doc__ = RuntimeOptions.__doc__
    # `auto` resolves here, to the backend this process's Keras runs on:
    # the resolved recipe (and a run folder's recipe.yaml, which `resume`
    # reads) names the backend that ran.
    backend: Literal["auto", "tensorflow", "jax"] = Field("auto", validate_default=True)

    @field_validator("backend")
    @classmethod
    def _resolve_auto(cls, value: str) -> str:
        return backend.resolve(value)


class OutputConfig(CheckpointOptions):
    """The run folder (`advtrain.fit`'s `checkpoints`), plots and logs.
    `tensorboard` and `export_saved_model` need TensorFlow: `auto` writes
    them where it can (the resolved recipe says which), `true` is refused
    where it cannot (`Recipe.check_runnable`)."""

    tensorboard: Union[Literal["auto"], bool] = "auto"
    plots: bool = True
    export_saved_model: Union[Literal["auto"], bool] = "auto"


_INSTALL = f"TensorFlow: {backend.install_command(['tensorflow'])}"


def _unwritable_outputs(backend_name: str) -> dict[str, str]:
    """Why each TensorFlow output cannot be written for a run on
    `backend_name` in this environment (absent: it can)."""
    reasons = {}
    if not backend.HAS_TENSORFLOW:
        reasons["tensorboard"] = f"TensorBoard's logs need {_INSTALL}"
    if not backend.exports_saved_model(backend_name):
        reasons["export_saved_model"] = (
            f"the SavedModel export needs {_INSTALL} (model.keras loads on "
            "every backend)"
            if not backend.HAS_TENSORFLOW
            else f"Keras exports no SavedModel from {backend_name}"
        )
    return reasons


class Recipe(Options):
    """A whole training run; `plugins` are imported (their code runs)
    before the rest is checked, so what they register can be named."""

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
            import_plugins(data["plugins"])
        return data

    @model_validator(mode="after")
    def _tensorflow_only_output(self) -> Recipe:
        # `auto`: the TensorFlow outputs this environment can write, resolved
        # so that the saved recipe says what the run wrote; `true` stays
        # (refused by `check_runnable` where it cannot be written).
        output = self.output
        unwritable = _unwritable_outputs(self.runtime.backend)
        for key in ("tensorboard", "export_saved_model"):
            if getattr(output, key) == "auto":
                setattr(output, key, key not in unwritable)
        return self

    def check_runnable(self) -> None:
        """Raises `RecipeError` for a setting this process cannot run, before
        a run writes anything: a TensorFlow output set true (TensorBoard's
        logs, the SavedModel export) that this environment cannot write, or
        `attack.backend: cleverhans` where Keras does not run on TensorFlow.
        Checked by the run, not at load: a recipe for another backend loads
        anywhere, and the CLI restarts itself on the recipe's backend."""
        name = self.runtime.backend
        for key, reason in _unwritable_outputs(name).items():
            if getattr(self.output, key) is True:
                raise RecipeError(
                    f"output.{key}: {reason}; set it auto or false. Received: "
                    f"output.{key}=true, runtime.backend={name}"
                )
        if self.attack.backend == "cleverhans" and not backend.IMPORTS_TENSORFLOW:
            raise RecipeError(
                "attack.backend: the cleverhans backend runs on TensorFlow "
                "only; set attack.backend: advtrain, or runtime.backend: "
                "tensorflow with TensorFlow installed. Received: "
                f"attack.backend=cleverhans, runtime.backend={name}"
            )

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
        """The resolved recipe, without method keys the method does not take."""
        data = self.model_dump(mode="json")
        data["attack"] = without_untaken_keys(data["attack"])
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def import_plugins(modules: Any) -> None:
    """Imports each module a recipe's `plugins` names (the current folder
    searched last, as `python -m` would); a failure names the module."""
    if not isinstance(modules, list) or not all(
        isinstance(m, str) and _MODULE.fullmatch(m) for m in modules
    ):
        raise ValueError(
            "plugins: expected a list of module names such as "
            f"[my_package.attacks]. Received: plugins={modules!r}"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure is the recipe's
            raise ValueError(
                f"plugins: cannot import '{name}' ({type(exc).__name__}: "
                f"{one_line(exc)})"
            ) from None
