"""`AdversarialModel`: a keras.Model that trains on clean and adversarial loss.

The model reads as Keras's own trainer: `train_step` picks one of two
steps, each one screen long. Its parts live beside it:
`adversarial_arguments` (the rules on the arguments),
`adversarial_metrics` (the metrics it adds and when each is logged),
`reuse_gradient` (the gradient-reusing step and when it runs),
`input_checks` (the in-graph checks on every training batch) and
`trainers` (what differs per Keras backend: the gradients, the state
handling, TensorFlow's fused BatchNorm kernel). The steps are written in
`keras.ops` and train on TensorFlow and JAX.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import keras
from keras import ops

from advtrain.attacks import Attack
from advtrain.models import adversarial_metrics as am
from advtrain.models.adversarial_arguments import (
    check_hooks,
    check_keywords_known,
    checked_arguments,
    constructor_arguments,
    fit_arguments,
    renamed_config,
    set_momentum_for_fit,
)
from advtrain.models.adversarial_metrics import (
    OptionalAccuracy,
    OptionalMean,
    replicas_in_sync,
)
from advtrain.models.attack_then_train import train_step_after_attack
from advtrain.models.eps_ramp import EpsRamp
from advtrain.models.input_checks import (
    InputChecks,
    model_input_checks,
    warn_if_probability_output,
)
from advtrain.models.reuse_gradient import (
    REUSE_GRADIENT_BYPASSES,
    choose_step,
    train_step_reusing_gradient,
)
from advtrain.models.trainers import AdversarialTrainer

__all__ = ["AdversarialModel", "replicas_in_sync"]


@keras.saving.register_keras_serializable(package="advtrain")
class AdversarialModel(AdversarialTrainer, keras.Model):
    """Wraps a classifier; `fit` minimises a clean/adversarial loss mix.

    loss = (1 - adv_weight) * clean_loss + adv_weight * adversarial_loss,
    with the compiled loss (`from_logits=True`: the classifier returns
    logits), keeping Keras semantics: loss scaling, sample weights,
    compiled metrics (on the clean batch), `tf.distribute` reductions,
    `steps_per_execution`, `.keras` saving. The step (`step_note` says
    which and why) is the gradient-reusing one for plain FGSM with a clean
    term (`advtrain.models.reuse_gradient`), else the attack in inference
    mode, then one training pass (`advtrain.models.attack_then_train`).
    Every training batch's pixels and labels are checked in the graph
    (`advtrain.models.input_checks`: one-line `PixelRangeError`,
    `LabelError`). Logged beside the compiled metrics, where a step feeds
    them: `clean_loss`, `adv_loss`, `adv_accuracy`, `zero_grad_fraction`
    (`advtrain.models.adversarial_metrics`).

    Research code overrides the hooks `generate_adversarial` and
    `adversarial_loss` (built from `compute_loss`, `reduce_per_example`
    and `track_losses`, so it is right on any number of replicas);
    `TRADES` is built that way. The gradient-reusing step bypasses them
    (and `attack_model_fn`, `attack_loss_scale`): a subclass overriding
    one gets the inference-mode step.

    Args:
        classifier: a Keras model mapping [0, 1] pixels to logits.
        attack: an `Attack` (or its config dict) used during training.
        adv_weight: the adversarial loss's weight, in [0, 1] (0: plain
            Keras training, the attack skipped).
        attack_mode: "inference" (default) or "train" (BatchNorm statistics
            update during the attack): the classifier's mode when attacked.
        seed: seed of the attack's random start (saved with the model).
        reuse_gradient: "auto" (default): the gradient-reusing step exactly
            for plain FGSM, 0 < adv_weight < 1 and no bypassed hook
            overridden; True forces it (FGSM or FGSM-RS); False never.
            Called `fused` before 0.3.
        fused_batchnorm: on TensorFlow, compute the classifier's plain
            BatchNormalization layers with TensorFlow's fused kernel while
            a train or test step runs (`advtrain.models.batchnorm.fused`:
            the same results, faster); the layers stay Keras's own, so a
            saved classifier loads without advtrain. False: Keras's ops.
        batchnorm_momentum: "auto" (default): on the first `fit`, BN layers
            still at Keras's 0.99 get the run length's momentum; a number
            sets every BN layer; None keeps them
            (`advtrain.models.batchnorm.policy`).
        eps_ramp_steps: 0 (default) or the optimizer steps over which the
            training attack's eps and step sizes grow from ~0 to their
            values (`advtrain.models.eps_ramp`); evaluation uses full eps.
        check_inputs: check every training batch's pixels and labels (see
            above); False skips the checks.

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
            type(self).__name__, kwargs, constructor_arguments(type(self))
        )
        super().__init__(**kwargs)
        # Arguments, checked before anything is built.
        check_hooks(type(self))
        attack = checked_arguments(
            attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
        )
        self.reuse_gradient_step, self._step_reason = self._choose_step(
            reuse_gradient, attack, adv_weight
        )
        self.classifier = classifier
        self.attack = attack
        self.adv_weight = float(adv_weight)
        self.attack_mode = attack_mode
        self.seed = seed
        self.reuse_gradient = reuse_gradient
        self.eps_ramp_steps = eps_ramp_steps
        self.check_inputs = bool(check_inputs)
        # BatchNorm: the fused kernel while a step runs (TensorFlow's
        # trainer); the momentum on the first `fit`, which knows its length.
        self.fused_batchnorm = bool(fused_batchnorm)
        self.batchnorm_momentum = batchnorm_momentum
        self._batchnorm_momentum_set = batchnorm_momentum is None
        # State the steps use: the attack's random stream, the input checks
        # (rebuilt once compiled), the metrics.
        self.seed_generator = keras.random.SeedGenerator(seed)
        self._input_checks = InputChecks()
        # The step's own loss tracker (replaces Keras's, see `metrics`).
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.clean_loss_tracker = OptionalMean(name="clean_loss")
        self.adv_loss_tracker = OptionalMean(name="adv_loss")
        self.adv_accuracy = OptionalAccuracy(name="adv_accuracy")
        self.zero_grad_tracker = OptionalMean(name="zero_grad_fraction")

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
        """Applies the constructor's rules to these arguments without
        building a model: a recipe checks its attack section this way when
        it loads. A bad value is an `advtrain.utils.errors.ArgumentError`
        naming the argument.
        """
        check_keywords_known(
            f"{cls.__name__}.check_arguments",
            kwargs,
            ["attack", "adv_weight", "attack_mode", "reuse_gradient"]
            + ["batchnorm_momentum", "eps_ramp_steps"],
        )
        check_hooks(cls)
        attack = checked_arguments(
            attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
        )
        cls._choose_step(reuse_gradient, attack, adv_weight)

    @classmethod
    def _choose_step(cls, reuse_gradient, attack, adv_weight) -> tuple[bool, str]:
        """(gradient-reusing step or not, why), for this class."""
        overridden = [
            h
            for h in REUSE_GRADIENT_BYPASSES
            if getattr(cls, h) is not getattr(AdversarialModel, h)
        ]
        return choose_step(reuse_gradient, attack, adv_weight, cls.__name__, overridden)

    @property
    def step_note(self) -> str:
        """Which training step runs and why, in one line (the run header
        prints it).
        """
        if self.reuse_gradient_step:
            what = "gradient-reusing step, 2 forward + 2 backward passes"
        elif self.attack is None or self.adv_weight == 0:
            what = "clean step"
        else:
            what = f"attack in {self.attack_mode} mode, then one training pass"
        return f"{what} ({self._step_reason})"

    def training_attack(self) -> Optional[Attack]:
        """The attack the training step runs at `optimizer.iterations`:
        `attack` scaled by the eps ramp (`advtrain.models.eps_ramp`), which
        the step passes to `generate_adversarial`; `attack` itself without
        a ramp."""
        if not self.eps_ramp_steps or self.attack is None:
            return self.attack
        ramp = EpsRamp(self.eps_ramp_steps)
        return ramp.scaled(self.attack, ramp.scale(self.optimizer.iterations))

    def call(self, inputs, training=False):
        return self.classifier(inputs, training=training)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`, on training data checked against the attack's
        pixel range and the compiled loss (`advtrain.models.input_checks`)
        and, on the first call, `batchnorm_momentum="auto"` gives BN layers
        still at 0.99 the momentum of this call's length (epochs x steps)."""
        arguments = fit_arguments(*args, **kwargs)
        if arguments is None:  # Keras's own fit reports the bad arguments
            return super().fit(*args, **kwargs)
        checks = model_input_checks(self)
        arguments["x"] = checks.checked(arguments["x"], arguments.get("y"))
        if not self._batchnorm_momentum_set:
            self._batchnorm_momentum_set = True
            momentum = self.batchnorm_momentum
            if set_momentum_for_fit(self.classifier, momentum, arguments):
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

        `attack` is the step's attack: the training step passes
        `training_attack()` (eps-ramped), the test step `self.attack`; None
        means `self.attack`. The default runs it on `attack_model_fn`, with
        the loss scale of a mixed-precision optimizer, and stops gradients.

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

        `y_pred` is None when `adv_weight == 1` (and the subclass does not
        set `needs_clean_logits`); `y_pred_adv` is None when it is 0.

        Under `tf.distribute` each replica returns its share of the global
        batch's loss and the shares' gradients are summed. So build the loss
        from shares: `compute_loss(...)` (the compiled loss plus
        regularisation losses) and `reduce_per_example(values,
        sample_weight)` for a per-example term of your own. A plain
        `ops.mean` is the mean over one replica's examples and counts
        N times under N replicas. Log parts with `track_losses`. Written
        in `keras.ops`, it trains on TensorFlow and JAX.

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
        w = self.adv_weight
        parts = []
        clean = adv = None
        # Each part holds the regularisation losses; the weights sum to 1.
        if y_pred is not None:
            clean = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
            )
            parts.append((1.0 - w) * clean if y_pred_adv is not None else clean)
        if y_pred_adv is not None:
            adv = self.compute_loss(
                x=x_adv, y=y, y_pred=y_pred_adv, sample_weight=sample_weight
            )
            parts.append(w * adv if y_pred is not None else adv)
        self.track_losses(clean=clean, adv=adv)
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    def reduce_per_example(self, values, sample_weight=None):
        """This replica's share of the batch mean of a per-example term:
        `sum(values * sample_weight) / global_batch` (the global batch is
        this replica's times `num_replicas_in_sync`). Summed over replicas,
        as the gradients are, it is the mean over the whole batch, and it
        adds to `compute_loss` like for like. `values` has one value per
        example (further axes averaged first); `sample_weight` is None or
        one weight per example.

        Example:

        ```python
        gap = ops.sum(ops.square(y_pred - y_pred_adv), axis=-1)
        term = self.reduce_per_example(gap, sample_weight)
        ```
        """
        return am.batch_mean_share(values, sample_weight)

    def track_losses(self, clean=None, adv=None) -> None:
        """Logs `clean_loss` / `adv_loss` from loss shares.

        Pass the values as they enter the loss (from `compute_loss` or
        `reduce_per_example`, i.e. this replica's share); the logs show the
        per-example mean, the same on 1 or N replicas. A metric no step
        feeds is not logged.
        """
        if clean is not None:
            am.track_share(self.clean_loss_tracker, clean)
        if adv is not None:
            am.track_share(self.adv_loss_tracker, adv)

    # ------------------------------------------------------------ steps

    # `train_step` and `test_step` are the backend trainer's
    # (`advtrain.models.trainers`), in the backend's signature, around these.

    def _train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        warn_if_probability_output(self.classifier, getattr(self, "loss", None))
        am.begin_step(self.metrics)
        attack = self.training_attack()
        if self.reuse_gradient_step and self.adv_weight > 0:
            logs = train_step_reusing_gradient(self, attack, x, y, sample_weight)
        else:
            logs = train_step_after_attack(self, attack, x, y, sample_weight)
        return logs

    def _test_step(self, data):
        """Clean loss and metrics as Keras computes them, plus the attack's
        `adv_loss` / `adv_accuracy` on the same batch (full eps), so
        validation reports robust accuracy (`val_adv_accuracy`)."""
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
        """The compiled loss of a pass that takes no part in the gradient."""
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
        """Keras's metric results, without the metrics that no step of the
        current phase feeds (`advtrain.models.adversarial_metrics`).
        """
        return am.logged(self.metrics, super().get_metrics_result(), self._in_step())

    # ------------------------------------------------------------ config

    def get_config(self):
        attack = self.attack
        return {
            **super().get_config(),
            "classifier": keras.saving.serialize_keras_object(self.classifier),
            "attack": None if attack is None else attack.get_config(),
            "adv_weight": self.adv_weight,
            "attack_mode": self.attack_mode,
            "seed": self.seed,
            "reuse_gradient": self.reuse_gradient,
            "check_inputs": self.check_inputs,
            "fused_batchnorm": self.fused_batchnorm,
            "batchnorm_momentum": self.batchnorm_momentum,
            "eps_ramp_steps": self.eps_ramp_steps,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """The model `get_config` describes; a config saved by 0.2 (key
        "fused") loads too."""
        config = renamed_config(config)
        config["classifier"] = keras.saving.deserialize_keras_object(
            config["classifier"], custom_objects=custom_objects
        )
        return cls(**config)
