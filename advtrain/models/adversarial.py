"""`AdversarialModel`: a keras.Model that trains on clean and adversarial loss.

Its two steps (`reuse_gradient`, `attack_then_train`), argument rules,
metrics and input checks live beside it; its per-backend half
(`AdversarialTrainer`) in `advtrain/backend/<name>/trainer.py`.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import keras
from keras import ops

from advtrain.attacks import Attack
from advtrain.backend import AdversarialTrainer
from advtrain.models import adversarial_metrics as am
from advtrain.models.adversarial_arguments import (
    check_hooks,
    check_keywords_known,
    checked_arguments,
    fit_arguments,
    init_keywords,
    renamed_config,
    set_momentum_for_fit,
)
from advtrain.models.attack_then_train import (
    ramp_scale,
    scaled_attack,
    train_step_after_attack,
)
from advtrain.models.batchnorm.fused import fused_kernel
from advtrain.models.batchnorm.walk import batchnorm_layers
from advtrain.models.input_checks import model_input_checks, warn_if_probability_output
from advtrain.models.reuse_gradient import (
    REUSE_GRADIENT_BYPASSES,
    choose_step,
    train_step_reusing_gradient,
)

__all__ = ["AdversarialModel"]

# `get_config`'s plain keys, besides the classifier and the attack.
_CONFIG_KEYS = (
    "adv_weight",
    "attack_mode",
    "seed",
    "reuse_gradient",
    "check_inputs",
    "fused_batchnorm",
    "batchnorm_momentum",
    "eps_ramp_steps",
)


@keras.saving.register_keras_serializable(package="advtrain")
class AdversarialModel(AdversarialTrainer, keras.Model):
    """Wraps a classifier; `fit` minimises a clean/adversarial loss mix.

    loss = (1 - adv_weight) * clean_loss + adv_weight * adversarial_loss,
    with the compiled loss (`from_logits=True`), keeping Keras semantics
    (loss scaling, sample weights, compiled metrics on the clean batch,
    `tf.distribute` reductions, `.keras` saving). `fit` checks the training
    data's pixels and labels (`PixelRangeError`, `LabelError`). Logged where
    a step feeds them: `clean_loss`, `adv_loss`, `adv_accuracy`,
    `zero_grad_fraction`. Research code overrides the hooks
    `generate_adversarial` and `adversarial_loss` (as `TRADES` does).

    Args:
        classifier: a Keras model mapping [0, 1] pixels to logits.
        attack: an `Attack` (or its config dict) used during training.
        adv_weight: the adversarial loss's weight, in [0, 1] (0: plain
            Keras training, the attack skipped).
        attack_mode: "inference" (default) or "train" (BatchNorm statistics
            update during the attack): the classifier's mode when attacked.
        seed: seed of the attack's random start (saved with the model).
        reuse_gradient: "auto" (default): the gradient-reusing step exactly
            for plain FGSM, 0 < adv_weight < 1 and no hook overridden; True
            forces it (FGSM or FGSM-RS); False never. See `step_note`.
        fused_batchnorm: on TensorFlow, plain BatchNormalization layers use
            the fused kernel while a step runs; they stay Keras's own.
        batchnorm_momentum: "auto" (default): on the first `fit`, BN layers
            still at Keras's 0.99 get the run length's momentum; a number
            sets every BN layer; None keeps them.
        eps_ramp_steps: 0 (default) or the optimizer steps over which the
            training attack's eps and step sizes grow from ~0 to full
            (`ramp_scale`); evaluation uses the full eps.
        check_inputs: check the training data's pixels and labels.

    Example:

    ```python
    model = AdversarialModel(classifier, Attack("fgsm_rs", eps=0.1), 0.5)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(train_ds, epochs=3)
    ```
    """

    # Subclasses whose loss needs clean logits even at adv_weight == 1.
    needs_clean_logits = False

    def __init__(
        self,
        classifier: keras.Model,
        attack: Union[Attack, dict, None] = None,
        adv_weight: float = 0.5,
        attack_mode: str = "inference",
        seed: Optional[int] = None,
        reuse_gradient: Union[bool, str] = "auto",
        fused_batchnorm: bool = True,
        batchnorm_momentum: Union[str, float, None] = "auto",
        eps_ramp_steps: int = 0,
        check_inputs: bool = True,
        **kwargs: Any,
    ):
        check_keywords_known(
            type(self).__name__, kwargs, init_keywords(type(self), keras.Model)
        )
        super().__init__(**kwargs)
        attack, (self.reuse_gradient_step, self._step_reason) = self._checked(
            attack,
            adv_weight,
            attack_mode,
            reuse_gradient,
            batchnorm_momentum,
            eps_ramp_steps,
        )
        self.classifier = classifier
        self.attack = attack
        self.adv_weight = float(adv_weight)
        self.attack_mode = attack_mode
        self.seed = seed
        self.reuse_gradient = reuse_gradient
        self.eps_ramp_steps = eps_ramp_steps
        self.check_inputs = bool(check_inputs)
        self.fused_batchnorm = bool(fused_batchnorm)
        self.batchnorm_momentum = batchnorm_momentum
        # The momentum is set on the first `fit`, which knows its length.
        self._batchnorm_momentum_set = batchnorm_momentum is None
        self.seed_generator = keras.random.SeedGenerator(seed)
        # The step's own loss tracker (replaces Keras's, see `metrics`).
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.clean_loss_tracker = am.OptionalMean(name="clean_loss")
        self.adv_loss_tracker = am.OptionalMean(name="adv_loss")
        self.adv_accuracy = am.OptionalAccuracy(name="adv_accuracy")
        self.zero_grad_tracker = am.OptionalMean(name="zero_grad_fraction")

    @classmethod
    def check_arguments(
        cls,
        attack: Union[Attack, dict, None] = None,
        adv_weight: float = 0.5,
        attack_mode: str = "inference",
        reuse_gradient: Union[bool, str] = "auto",
        batchnorm_momentum: Union[str, float, None] = "auto",
        eps_ramp_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        """Applies the constructor's rules without building a model; a bad
        value is an `ArgumentError` naming the argument."""
        check_keywords_known(
            f"{cls.__name__}.check_arguments",
            kwargs,
            ["attack", "adv_weight", "attack_mode", "reuse_gradient"]
            + ["batchnorm_momentum", "eps_ramp_steps"],
        )
        cls._checked(
            attack,
            adv_weight,
            attack_mode,
            reuse_gradient,
            batchnorm_momentum,
            eps_ramp_steps,
        )

    @classmethod
    def _checked(
        cls, attack, adv_weight, attack_mode, reuse_gradient, momentum, ramp
    ) -> tuple[Optional[Attack], tuple[bool, str]]:
        check_hooks(cls)
        attack = checked_arguments(attack, adv_weight, attack_mode, ramp, momentum)
        overridden = [
            h
            for h in REUSE_GRADIENT_BYPASSES
            if getattr(cls, h) is not getattr(AdversarialModel, h)
        ]
        step = choose_step(reuse_gradient, attack, adv_weight, cls.__name__, overridden)
        return attack, step

    @property
    def step_note(self) -> str:
        """Which training step runs and why, in one line."""
        if self.reuse_gradient_step:
            what = "gradient-reusing step, 2 forward + 2 backward passes"
        elif self.attack is None or self.adv_weight == 0:
            what = "clean step"
        else:
            what = f"attack in {self.attack_mode} mode, then one training pass"
        return f"{what} ({self._step_reason})"

    def training_attack(self) -> Optional[Attack]:
        """The step's attack: `attack` scaled by the eps ramp at
        `optimizer.iterations`."""
        if not self.eps_ramp_steps or self.attack is None:
            return self.attack
        scale = ramp_scale(self.optimizer.iterations, self.eps_ramp_steps)
        return scaled_attack(self.attack, scale)

    def call(self, inputs, training=False):
        return self.classifier(inputs, training=training)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit` on training data checked against the attack's
        pixel range and the compiled loss; the first call sets the
        BatchNorm momentum for its length (`batchnorm_momentum`)."""
        arguments = fit_arguments(*args, **kwargs)
        if arguments is None:  # Keras's own fit reports the bad arguments
            return super().fit(*args, **kwargs)
        checks = model_input_checks(self)
        arguments["x"] = checks.checked(arguments["x"], arguments.get("y"))
        if not self._batchnorm_momentum_set:
            self._batchnorm_momentum_set = True
            set_momentum_for_fit(self.classifier, self.batchnorm_momentum, arguments)
            self.train_function = None  # traced with the old momentum
        with checks.clean_errors():
            return super().fit(**arguments)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        """`keras.Model.train_on_batch`, on a batch checked on the host."""
        model_input_checks(self).check_batch((x, y))
        return super().train_on_batch(x, y, *args, **kwargs)

    # ------------------------------------------------------------ hooks

    def attack_model_fn(self, inputs):
        """The classifier as the attack sees it (mode per `attack_mode`)."""
        return self.classifier(inputs, training=self.attack_mode == "train")

    def attack_loss_scale(self):
        """Loss scale for the attack's input gradient (mixed precision)."""
        optimizer = getattr(self, "optimizer", None)
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer.scale_loss(ops.convert_to_tensor(1.0))
        return None

    def generate_adversarial(self, x, y, attack=None):
        """Returns adversarial examples for `(x, y)`; override for research.

        `attack`: the step's attack (`training_attack()` in training; None:
        `self.attack`), run on `attack_model_fn`.

        Example:

        ```python
        class NoisyModel(AdversarialModel):
            def generate_adversarial(self, x, y, attack=None):
                eps = (attack or self.attack).eps
                noise = keras.random.uniform(ops.shape(x), -eps, eps)
                return ops.clip(x + noise, 0.0, 1.0)
        ```
        """
        attack = self.attack if attack is None else attack
        kwargs = {"return_gradient": True} if attack.single_step else {}
        x_adv = attack(
            self.attack_model_fn,
            x,
            y,
            loss_scale=self.attack_loss_scale(),
            seed=self.seed_generator,
            **kwargs,
        )
        if kwargs:
            x_adv, grad = x_adv
            am.track_zero_gradients(self.zero_grad_tracker, grad)
        return ops.stop_gradient(x_adv)

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        """The training loss; default `(1 - w) * clean + w * adversarial`.

        `y_pred` is None when `adv_weight == 1` (unless the class sets
        `needs_clean_logits`); `y_pred_adv` when it is 0. Each replica
        returns its share of the global batch's loss: build it from
        `compute_loss(...)` and `reduce_per_example` (a plain `ops.mean`
        counts N times under N replicas); log parts with `track_losses`.

        Example:

        ```python
        class LogitPairing(AdversarialModel):
            def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv,
                                 sample_weight):
                loss = super().adversarial_loss(
                    x, y, y_pred, x_adv, y_pred_adv, sample_weight)
                gap = ops.sum(ops.square(y_pred - y_pred_adv), axis=-1)
                return loss + 0.5 * self.reduce_per_example(gap, sample_weight)
        ```
        """
        clean = adv = None
        if y_pred is not None:
            clean = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
            )
        if y_pred_adv is not None:
            adv = self.compute_loss(
                x=x_adv, y=y, y_pred=y_pred_adv, sample_weight=sample_weight
            )
        self.track_losses(clean=clean, adv=adv)
        # Each part holds the regularisation losses; the weights sum to 1.
        if clean is None or adv is None:
            return adv if clean is None else clean
        return (1.0 - self.adv_weight) * clean + self.adv_weight * adv

    def reduce_per_example(self, values, sample_weight=None):
        """This replica's share of the batch mean of a per-example term
        (further axes averaged first), `sum(values * sample_weight) /
        global_batch`: it adds to `compute_loss` like for like.

        Example:

        ```python
        gap = ops.sum(ops.square(y_pred - y_pred_adv), axis=-1)
        term = self.reduce_per_example(gap, sample_weight)
        ```
        """
        values = ops.cast(values, "float32")
        rank = len(values.shape)
        if rank == 0:
            raise ValueError(
                "reduce_per_example needs one value per example, shape "
                f"[batch]. Received: shape={tuple(values.shape)}"
            )
        if rank > 1:
            values = ops.mean(values, axis=list(range(1, rank)))
        if sample_weight is not None:
            values = values * ops.reshape(ops.cast(sample_weight, "float32"), [-1])
        count = ops.cast(ops.shape(values)[0] * am.replicas_in_sync(), "float32")
        return ops.divide_no_nan(ops.sum(values), count)

    def track_losses(self, clean=None, adv=None) -> None:
        """Logs `clean_loss` / `adv_loss` from loss shares (as they enter
        the loss); the logs show the per-example mean on any replica count."""
        if clean is not None:
            self.clean_loss_tracker.update_state(am.global_mean(clean))
        if adv is not None:
            self.adv_loss_tracker.update_state(am.global_mean(adv))

    # ------------------------------------------------------------ steps
    # The backend trainer's `train_step` / `test_step` call these.

    def _train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        warn_if_probability_output(self.classifier, getattr(self, "loss", None))
        am.begin_step(self.metrics)
        attack = self.training_attack()
        if self.reuse_gradient_step and self.adv_weight > 0:
            return train_step_reusing_gradient(self, attack, x, y, sample_weight)
        return train_step_after_attack(self, attack, x, y, sample_weight)

    def _test_step(self, data):
        # Clean loss and metrics; the full-eps attack's `adv_loss` and
        # `adv_accuracy` on the same batch.
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        am.begin_step(self.metrics)
        y_pred = self(x, training=False)
        loss = self._inference_loss(x, y, y_pred, sample_weight)
        am.track_loss(self.loss_tracker, loss, x)
        self.track_losses(clean=loss)
        if self.attack is not None:
            x_adv = self.attack_step(
                lambda: self.generate_adversarial(x, y, attack=self.attack)
            )
            y_pred_adv = self(x_adv, training=False)
            adv = self._inference_loss(x_adv, y, y_pred_adv, sample_weight)
            self.track_losses(adv=adv)
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _inference_loss(self, x, y, y_pred, sample_weight):
        return self.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )

    @property
    def metrics(self):
        # `loss_tracker` stands in for Keras's own "loss" tracker, which
        # this model's steps do not feed.
        own = getattr(self, "loss_tracker", None)
        others = [m for m in super().metrics if m.name != "loss"]
        return others if own is None else [own, *others]

    def get_metrics_result(self):
        return am.logged(self.metrics, super().get_metrics_result(), self._in_step())

    def fused_kernel_scope(self):
        """A function returning the context in which the classifier's plain
        BatchNorm layers compute with the fused kernel (none without
        `fused_batchnorm`); a backend that has the kernel runs each step in
        it."""
        layers = batchnorm_layers(self.classifier) if self.fused_batchnorm else []
        return lambda: fused_kernel(layers)

    # ------------------------------------------------------------ config

    def get_config(self):
        return {
            **super().get_config(),
            "classifier": keras.saving.serialize_keras_object(self.classifier),
            "attack": None if self.attack is None else self.attack.get_config(),
            **{name: getattr(self, name) for name in _CONFIG_KEYS},
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        # A 0.2 config loads too.
        config = renamed_config(config)
        config["classifier"] = keras.saving.deserialize_keras_object(
            config["classifier"], custom_objects=custom_objects
        )
        return cls(**config)
