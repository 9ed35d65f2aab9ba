"""`AdversarialModel`: a keras.Model that trains on clean and adversarial loss."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Optional, Union

import keras
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.attacks.common import as_float_tensor
from advtrain.train.input_checks import InputChecks, label_kind, loss_name, output_shape
from advtrain.utils.errors import ArgumentError

ATTACK_MODES = ("inference", "train")
FUSED_CHOICES = (True, False, "auto")
# The hooks the fused step does not call: a subclass overriding one never
# gets that step (refused with fused=True, not chosen by fused="auto").
FUSED_BYPASSES = (
    "generate_adversarial",
    "adversarial_loss",
    "attack_model_fn",
    "attack_loss_scale",
)
PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


def replicas_in_sync() -> int:
    """Replicas that each compute a share of the step (1 without tf.distribute)."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def probability_activation(model: keras.Model) -> Optional[str]:
    """The activation ("softmax" or "sigmoid") `model` ends in, else None."""
    layer = model
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if name in PROBABILITY_ACTIVATIONS else None


class _Measured:
    """Notes, while a step is traced, whether the step updated the metric,
    so that the step logs only what it measured."""

    measured = False

    def update_state(self, *args, **kwargs):
        self.measured = True
        return super().update_state(*args, **kwargs)


class _MeasuredMean(_Measured, keras.metrics.Mean):
    pass


class _MeasuredAccuracy(_Measured, keras.metrics.SparseCategoricalAccuracy):
    pass


@keras.saving.register_keras_serializable(package="advtrain")
class AdversarialModel(keras.Model):
    """Wraps a classifier; `fit` minimises a clean/adversarial loss mix.

    loss = (1 - adv_weight) * clean_loss + adv_weight * adversarial_loss,
    with the compiled loss (use `from_logits=True`: the classifier returns
    logits). Two steps, chosen by `fused` (default "auto"; `step_note`
    says which runs and why):
    - the fused step, for plain FGSM from the clean point with a clean
      loss term (0 < adv_weight < 1): the clean training pass's own
      backward pass gives the input gradient, so a step costs 2 forward +
      2 backward passes (Goodfellow et al.'s formulation, and NSL's);
    - otherwise the attack runs with the classifier in inference mode (no
      BatchNorm statistics update, no dropout) under `stop_gradient`, then
      one training forward pass over the clean and adversarial batch
      together (3 + 3 passes for FGSM).
    Both keep Keras semantics: loss scaling under mixed precision, sample
    weights, compiled metrics (on the clean batch), `tf.distribute`
    reductions, `steps_per_execution`, and `.keras` saving.

    Every training batch is checked in the step's graph (a min and a max,
    `advtrain.train.input_checks`): pixels outside the attack's
    `[clip_min, clip_max]` (0-255 images, say) stop `fit` at that batch
    with one `PixelRangeError` line, and labels the compiled cross-entropy
    cannot use (outside [0, classes), one-hot with a sparse loss, integers
    with a categorical one) with one `LabelError` line.

    Metrics added to the compiled ones, each logged only when the step
    measured it: `clean_loss`, `adv_loss`, `adv_accuracy` (accuracy on the
    adversarial batch) and `zero_grad_fraction` (single-step attacks: the
    share of input-gradient entries that are exactly zero).

    Research code overrides two small hooks:
    - `generate_adversarial(x, y)` returns the adversarial batch;
    - `adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)`
      returns the scalar training loss, built from `compute_loss` and
      `reduce_per_example` so that it is right under any number of
      replicas (see `adversarial_loss`).
    `TRADES` in `advtrain.models.objectives.trades` is built that way. The fused step
    calls neither hook (nor `attack_model_fn`, `attack_loss_scale`): a
    subclass overriding one gets the inference-mode step under "auto", and
    `fused=True` is refused for it.

    Args:
        classifier: a Keras model mapping [0, 1] pixels to logits.
        attack: an `Attack` (or its config dict) used during training.
        adv_weight: weight of the adversarial loss, in [0, 1]. With 0 the
            attack is skipped and training equals plain Keras training.
        attack_mode: "inference" (default) or "train": the mode the
            classifier runs in while the attack differentiates through it.
            "train" updates BatchNorm statistics during the attack.
        seed: seed of the attack's random start (its state is saved with
            the model, so a resumed run continues the same stream).
        fused: "auto" (default): the fused step exactly when the attack is
            plain FGSM from the clean point (method "fgsm", advtrain
            backend), 0 < adv_weight < 1 and no hook it bypasses is
            overridden. True forces it for FGSM or FGSM-RS (with a random
            start it steps from the random point with the clean-point
            gradient); False never uses it. The fused step takes the input
            gradient from the clean loss's own backward pass in training
            mode: 2 forward + 2 backward passes, the minimum for a clean +
            adversarial loss, and the attack sees training-mode BatchNorm
            (batch statistics).
        fused_batchnorm: switch the classifier's plain Keras
            BatchNormalization layers to
            `advtrain.models.batchnorm.fused.FusedBatchNormalization`, in
            place (same variables and results, TensorFlow's faster fused
            kernel); False leaves the model as it is.
        batchnorm_momentum: "adapt" (default): on the first `fit`, BN
            layers still at Keras's default 0.99 get a momentum that suits
            the run's length (see `fit`); "auto": every BN layer gets it; a
            number sets every BN layer; None keeps them
            (`advtrain.models.batchnorm.policy.set_momentum`).
        eps_ramp_steps: 0 (default) or the number of optimizer steps over
            which the training attack's eps and step sizes grow linearly
            from ~0 to their values (`advtrain.models.eps_ramp.EpsRamp`,
            from `optimizer.iterations`, so resuming continues the ramp).
            `test_step` and evaluation always use the full eps.
        check_inputs: check every training batch's pixels against the
            attack's `[clip_min, clip_max]` and its labels against the
            compiled cross-entropy (see above); False skips the checks.

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
        fused: Union[bool, str] = "auto",
        fused_batchnorm: bool = True,
        batchnorm_momentum: Union[str, float, None] = "adapt",
        eps_ramp_steps: int = 0,
        check_inputs: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        attack = _checked_arguments(
            attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
        )
        self.fused_step, self._step_reason = self._choose_step(
            fused, attack, adv_weight
        )
        self.classifier = classifier
        self.fused_batchnorm = bool(fused_batchnorm)
        if self.fused_batchnorm:
            from advtrain.models.batchnorm.fused import fuse_batchnorm

            # In place: the layers keep their variables and weights.
            fuse_batchnorm(classifier)
        self.batchnorm_momentum = batchnorm_momentum
        self._batchnorm_momentum_set = batchnorm_momentum is None
        self.attack = attack
        self.eps_ramp_steps = eps_ramp_steps
        self.fused = fused
        self.check_inputs = bool(check_inputs)
        self._input_checks = InputChecks()
        self.adv_weight = float(adv_weight)
        self.attack_mode = attack_mode
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        # The step's own loss tracker (replaces Keras's, see `metrics`).
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.clean_loss_tracker = _MeasuredMean(name="clean_loss")
        self.adv_loss_tracker = _MeasuredMean(name="adv_loss")
        self.adv_accuracy = _MeasuredAccuracy(name="adv_accuracy")
        # Share of input-gradient entries that are exactly zero: under
        # float16 an unscaled loss underflows and FGSM silently stops.
        self.zero_grad_tracker = _MeasuredMean(name="zero_grad_fraction")
        self._zero_grad = None

    @classmethod
    def check_arguments(
        cls,
        attack: Union[Attack, dict, None] = None,
        adv_weight: float = 0.5,
        attack_mode: str = "inference",
        fused: Union[bool, str] = "auto",
        batchnorm_momentum: Union[str, float, None] = "adapt",
        eps_ramp_steps: int = 0,
    ) -> None:
        """Applies the constructor's rules to these arguments without
        building a model: a recipe checks its attack section this way when
        it loads. A bad value is an `advtrain.utils.errors.ArgumentError`
        naming the argument.

        Example:

        ```python
        AdversarialModel.check_arguments(Attack("pgd", eps=0.1), fused=True)
        # ArgumentError: fused: fused=True needs a single-step attack ...
        ```
        """
        attack = _checked_arguments(
            attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
        )
        cls._choose_step(fused, attack, adv_weight)

    @classmethod
    def _choose_step(
        cls, fused: Union[bool, str], attack: Optional[Attack], adv_weight: float
    ) -> tuple[bool, str]:
        """(fused step or not, why): `fused` resolved for this class."""
        if fused is not True and fused is not False and fused != "auto":
            raise ArgumentError(
                "fused",
                f"must be True, False or 'auto'. Received: fused={fused!r}",
            )
        overridden = [
            h
            for h in FUSED_BYPASSES
            if getattr(cls, h) is not getattr(AdversarialModel, h)
        ]
        if fused is True and overridden:
            raise ArgumentError(
                "fused",
                "fused=True needs the default generate_adversarial, "
                "adversarial_loss, attack_model_fn and attack_loss_scale hooks "
                f"(the fused step calls none of them); {cls.__name__} "
                f"overrides {', '.join(overridden)}. Received: fused=True",
            )
        if fused is True and (attack is None or not attack.fusable):
            received = (
                "attack=None"
                if attack is None
                else f"method={attack.method!r}, backend={attack.backend!r}"
            )
            raise ArgumentError(
                "fused",
                "fused=True needs a single-step attack (method fgsm or "
                f"fgsm_rs, backend advtrain). Received: {received}",
            )
        if fused != "auto":
            return fused, f"fused={fused}"
        if attack is None or adv_weight == 0:
            return False, "auto: no attack in training (adv_weight=0)"
        if overridden:
            return False, f"auto: {cls.__name__} overrides {', '.join(overridden)}"
        if attack.method != "fgsm" or attack.backend != "advtrain":
            return False, (
                f"auto: method {attack.method} on the {attack.backend} backend "
                "is not plain FGSM from the clean point"
            )
        if adv_weight == 1:
            return False, "auto: adv_weight=1, no clean loss term to reuse"
        return True, "auto: plain FGSM from the clean point, 0 < adv_weight < 1"

    @property
    def step_note(self) -> str:
        """Which training step runs and why, in one line (the run header
        prints it), e.g. "fused step, 2 forward + 2 backward passes (auto:
        plain FGSM from the clean point, 0 < adv_weight < 1)"."""
        if self.fused_step:
            what = "fused step, 2 forward + 2 backward passes"
        elif self.attack is None or self.adv_weight == 0:
            what = "clean step"
        else:
            what = f"attack in {self.attack_mode} mode, then one training pass"
        return f"{what} ({self._step_reason})"

    def call(self, inputs, training=False):
        return self.classifier(inputs, training=training)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`, with BatchNorm momentum set for the run first.

        On the first call, `batchnorm_momentum="adapt"` gives the
        classifier's BN layers still at Keras's default 0.99 the momentum
        that suits this call's length (epochs x steps per epoch, from
        `steps_per_epoch`, the dataset's cardinality or the arrays'
        length; `advtrain.models.batchnorm.policy.auto_momentum`) and warns once
        saying so; layers set to another momentum are kept. "auto" gives
        it to every BN layer, a number sets every BN layer; None keeps
        them all.

        Labels whose shape does not suit the compiled cross-entropy
        (one-hot for a sparse loss, or the reverse) raise `LabelError`
        here, before Keras builds anything.
        """
        arguments = _fit_arguments(*args, **kwargs)
        shape = _label_shape(arguments)
        if self.check_inputs and shape is not None:
            self._make_input_checks().check_label_shape(shape)
        if not self._batchnorm_momentum_set:
            self._batchnorm_momentum_set = True
            self._set_batchnorm_momentum(arguments)
        return super().fit(*args, **kwargs)

    def _set_batchnorm_momentum(self, arguments: Optional[dict]) -> None:
        import inspect

        from advtrain.models.batchnorm.policy import (
            MOMENTUM_RULES,
            fit_total_steps,
            set_momentum,
        )

        steps = None
        if self.batchnorm_momentum in MOMENTUM_RULES:
            if arguments is None:
                return  # Keras's own fit reports the bad arguments
            names = inspect.signature(fit_total_steps).parameters
            steps = fit_total_steps(
                **{k: v for k, v in arguments.items() if k in names}
            )
        note = set_momentum(self.classifier, self.batchnorm_momentum, steps)
        if getattr(self, "train_function", None) is not None:
            self.train_function = None  # traced with the old momentum
        if note:
            warnings.warn(
                f"{note} Pass batchnorm_momentum=None to keep them.", stacklevel=3
            )

    # ------------------------------------------------------------ hooks

    def attack_model_fn(self, inputs):
        """The classifier as the attack sees it (mode per `attack_mode`)."""
        return self.classifier(inputs, training=self.attack_mode == "train")

    def attack_loss_scale(self):
        """Loss scale for the attack's input gradient (mixed precision)."""
        optimizer = getattr(self, "optimizer", None)
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer.scale_loss(tf.constant(1.0))
        return None

    def generate_adversarial(self, x, y):
        """Returns adversarial examples for `(x, y)`; override for research.

        The default runs `self.attack` on `attack_model_fn`, with the loss
        scale of a mixed-precision optimizer, and stops gradients.

        Example:

        ```python
        class NoisyModel(AdversarialModel):
            def generate_adversarial(self, x, y):
                noise = keras.random.uniform(tf.shape(x), -0.1, 0.1)
                return tf.clip_by_value(x + noise, 0.0, 1.0)
        ```
        """
        kwargs = {"return_gradient": True} if self.attack.single_step else {}
        x_adv = self.attack(
            self.attack_model_fn,
            x,
            y,
            loss_scale=self.attack_loss_scale(),
            seed=self.seed_generator,
            **kwargs,
        )
        if kwargs:
            x_adv, grad = x_adv
            self._zero_grad = grad
        return tf.stop_gradient(x_adv)

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        """The training loss; default `(1 - w) * clean + w * adversarial`.

        `y_pred` is None when `adv_weight == 1` (and the subclass does not
        set `needs_clean_logits`); `y_pred_adv` is None when it is 0.

        Under `tf.distribute` each replica returns its share of the global
        batch's loss and the shares' gradients are summed. So build the loss
        from shares: `compute_loss(...)` (the compiled loss plus
        regularisation losses) and `reduce_per_example(values,
        sample_weight)` for a per-example term of your own. A plain
        `tf.reduce_mean` is the mean over one replica's examples and counts
        N times under N replicas. Log parts with `track_losses`.

        Example:

        ```python
        class LogitPairing(AdversarialModel):
            def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv,
                                 sample_weight):
                loss = super().adversarial_loss(
                    x, y, y_pred, x_adv, y_pred_adv, sample_weight)
                gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
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
        return tf.add_n(parts)

    def reduce_per_example(self, values, sample_weight=None):
        """This replica's share of the batch mean of a per-example term.

        Returns `sum(values * sample_weight) / global_batch`, where the
        global batch is this replica's batch times
        `num_replicas_in_sync`. Summed over replicas, as the step's
        gradients are, it is the mean over the whole batch: the same loss
        on 1 or N replicas. Keras's losses (`sum_over_batch_size`) reduce
        the same way, so it adds to `compute_loss` like for like.

        Args:
            values: one value per example, shape `[batch]`; further axes
                are averaged first.
            sample_weight: None, or one weight per example.

        Example:

        ```python
        gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
        term = self.reduce_per_example(gap, sample_weight)
        ```
        """
        values = tf.cast(values, tf.float32)
        if values.shape.rank is None or values.shape.rank == 0:
            raise ValueError(
                "reduce_per_example needs one value per example, shape "
                f"[batch]. Received: shape={values.shape}"
            )
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        if sample_weight is not None:
            values = values * tf.reshape(tf.cast(sample_weight, tf.float32), [-1])
        count = tf.cast(tf.shape(values)[0] * replicas_in_sync(), tf.float32)
        return tf.math.divide_no_nan(tf.reduce_sum(values), count)

    def track_losses(self, clean=None, adv=None) -> None:
        """Logs `clean_loss` / `adv_loss` from loss shares.

        Pass the values as they enter the loss (from `compute_loss` or
        `reduce_per_example`, i.e. this replica's share); the logs show the
        per-example mean, the same on 1 or N replicas. A metric no step
        feeds is not logged.
        """
        replicas = replicas_in_sync()
        if clean is not None:
            self.clean_loss_tracker.update_state(tf.cast(clean, tf.float32) * replicas)
        if adv is not None:
            self.adv_loss_tracker.update_state(tf.cast(adv, tf.float32) * replicas)

    @property
    def metrics(self):
        # `loss_tracker` stands in for Keras's own "loss" tracker, which
        # this model's steps do not feed.
        own = getattr(self, "loss_tracker", None)
        others = [m for m in super().metrics if m.name != "loss"]
        return others if own is None else [own, *others]

    # ------------------------------------------------------------ step

    def _forward(self, x, x_adv):
        """Training-mode logits for the clean and adversarial batches.

        Both go through one forward pass: one BatchNorm update per step and
        better device utilisation than two half-size passes.
        """
        if x_adv is None:
            return self(x, training=True), None
        if self.adv_weight == 1.0 and not self.needs_clean_logits:
            return None, self(x_adv, training=True)
        both = self(tf.concat([x, x_adv], axis=0), training=True)
        y_pred, y_pred_adv = tf.split(both, 2, axis=0)
        return y_pred, y_pred_adv

    def _track_zero_gradients(self) -> None:
        grad, self._zero_grad = self._zero_grad, None
        if grad is not None:
            zero = tf.cast(tf.equal(grad, 0), tf.float32)
            self.zero_grad_tracker.update_state(tf.reduce_mean(zero))

    def _track_loss(self, loss, x) -> None:
        # Per example over the global batch, as Keras's own tracker does.
        self.loss_tracker.update_state(
            tf.cast(loss, tf.float32) * replicas_in_sync(),
            sample_weight=tf.shape(x)[0],
        )

    def _begin_measuring(self) -> None:
        self._measuring = True  # get_metrics_result: the step filters
        for metric in self.metrics:
            if isinstance(metric, _Measured):
                metric.measured = False

    def _measured(self, logs, mode: str):
        """`logs` without the metrics this step did not update."""
        skip = {
            m.name for m in self.metrics if isinstance(m, _Measured) and not m.measured
        }
        self._unmeasured = {**getattr(self, "_unmeasured", {}), mode: skip}
        self._measuring = False
        return {k: v for k, v in logs.items() if k not in skip}

    def get_metrics_result(self):
        """The metrics' results, without those the step does not measure.

        Keras reads these at the end of an epoch (aggregated over replicas)
        when their names match the step's logs; so they must match.
        """
        mode = getattr(self, "_metrics_mode", "train")
        skip = getattr(self, "_unmeasured", {}).get(mode, ())
        if getattr(self, "_measuring", False):
            skip = ()
        logs = super().get_metrics_result()
        return {k: v for k, v in logs.items() if k not in skip}

    def evaluate(self, *args, **kwargs):
        # Validation inside `fit` calls this too: test_step's metrics.
        self._metrics_mode = "test"
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._metrics_mode = "train"

    def _warn_if_probability_output(self) -> None:
        activation = probability_activation(self.classifier)
        config = getattr(getattr(self, "loss", None), "get_config", dict)()
        if activation and config.get("from_logits"):
            warnings.warn(
                f"The classifier's last layer applies {activation}, but the "
                "loss has from_logits=True (and the attacks take logits too): "
                "remove the final activation so the classifier returns "
                f"logits. Received: activation={activation}, "
                f"loss={type(self.loss).__name__}",
                stacklevel=2,
            )

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        self._warn_if_probability_output()
        x, y, stats = self._input_checks.attach(x, y, xla=self._compiled_by_xla())
        self._begin_measuring()
        if self.fused_step and self.adv_weight > 0:
            with self._ramped_attack():
                logs = self._fused_train_step(x, y, sample_weight)
        else:
            logs = self._attack_then_train_step(x, y, sample_weight)
        return {**self._measured(logs, "train"), **stats}

    def _attack_then_train_step(self, x, y, sample_weight):
        """The attack (inference mode by default), then one training pass
        over the clean and adversarial batch together."""
        x_adv = None
        if self.adv_weight > 0 or self.needs_clean_logits:
            with self._ramped_attack():
                x_adv = self.generate_adversarial(x, y)
            self._track_zero_gradients()
        with tf.GradientTape() as tape:
            y_pred, y_pred_adv = self._forward(x, x_adv)
            loss = self.adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
            scaled = self.optimizer.scale_loss(loss)
        self._track_loss(loss, x)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))  # noqa: B905 (traced: autograph)
        if y_pred_adv is not None:
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        if y_pred is None:
            # adv_weight == 1: clean metrics (and clean_loss, for the log)
            # from an inference pass; it takes no part in the gradient.
            y_pred = self(x, training=False)
            if not self.clean_loss_tracker.measured:
                self.track_losses(
                    clean=self._inference_loss(x, y, y_pred, sample_weight)
                )
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # ------------------------------------------------------------ input checks

    def _make_input_checks(self) -> InputChecks:
        """The checks for the compiled model: the attack's pixel range (when
        it runs in training), the compiled loss's labels, the logits."""
        if not self.check_inputs:
            return InputChecks()
        attacked = self.attack is not None and (
            self.adv_weight > 0 or self.needs_clean_logits
        )
        loss = getattr(self, "loss", None)
        return InputChecks(
            (self.attack.clip_min, self.attack.clip_max) if attacked else None,
            logits_shape=output_shape(self.classifier),
            labels=label_kind(loss),
            loss_name=loss_name(loss),
        )

    def _compiled_by_xla(self) -> bool:
        # XLA drops assertions: the checks' reductions leave with the logs.
        return bool(getattr(self, "jit_compile", False)) and not tf.executing_eagerly()

    def make_train_function(self, force=False):
        """Keras's train function, whose failed input checks (see the class
        docstring) raise their one-line error."""
        if self.train_function is not None and not force:
            return self.train_function
        super().make_train_function(force=force)
        step = self.train_function
        # Read by train_step when the function traces.
        checks = self._input_checks = self._make_input_checks()

        def train_function(iterator):
            with checks.clean_errors():
                logs = step(iterator)
            return checks.check_logs(logs)

        self.train_function = train_function
        return train_function

    def test_step(self, data):
        """Clean loss and metrics as Keras computes them, plus the attack's
        `adv_loss` / `adv_accuracy` on the same batch, so validation
        reports robust accuracy (`val_adv_accuracy`)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        self._begin_measuring()
        y_pred = self(x, training=False)
        loss = self._inference_loss(x, y, y_pred, sample_weight)
        self._track_loss(loss, x)
        self.track_losses(clean=loss)
        if self.attack is not None:
            x_adv = self.generate_adversarial(x, y)
            self._track_zero_gradients()
            y_pred_adv = self(x_adv, training=False)
            adv = self._inference_loss(x_adv, y, y_pred_adv, sample_weight)
            self.track_losses(adv=adv)
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        logs = self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return self._measured(logs, "test")

    def _inference_loss(self, x, y, y_pred, sample_weight):
        """The compiled loss of a pass that takes no part in the gradient."""
        return self.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )

    @contextlib.contextmanager
    def _ramped_attack(self):
        """`self.attack` scaled by the eps ramp at this step, inside."""
        if not self.eps_ramp_steps:
            yield
            return
        from advtrain.models.eps_ramp import EpsRamp

        ramp, full = EpsRamp(self.eps_ramp_steps), self.attack
        self.attack = ramp.scaled(full, ramp.scale(self.optimizer.iterations))
        try:
            yield
        finally:
            self.attack = full

    def _fused_train_step(self, x, y, sample_weight):
        """Clean pass gives weight and input gradients; then the adversarial
        pass. 2 forward + 2 backward passes; BatchNorm sees both batches
        in training mode (statistics updated twice per step)."""
        variables = self.trainable_variables
        w = self.adv_weight
        x = as_float_tensor(x)  # the attack's own check: float pixels
        with tf.GradientTape() as tape:
            tape.watch(x)
            y_pred = self(x, training=True)
            clean = self.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
            )
            scaled_clean = self.optimizer.scale_loss(clean)
        grads = tape.gradient(scaled_clean, [x] + variables)
        input_grad, clean_grads = grads[0], grads[1:]
        self._zero_grad = input_grad
        self._track_zero_gradients()
        x_adv = tf.stop_gradient(
            self.attack.step_from_gradient(x, input_grad, self.seed_generator)
        )
        with tf.GradientTape() as tape:
            y_pred_adv = self(x_adv, training=True)
            adv = self.compute_loss(
                x=x_adv, y=y, y_pred=y_pred_adv, sample_weight=sample_weight
            )
            scaled_adv = self.optimizer.scale_loss(adv)
        adv_grads = tape.gradient(scaled_adv, variables)
        gradients = [
            None
            if gc is None and ga is None
            else (1.0 - w) * (0.0 if gc is None else gc)
            + w * (0.0 if ga is None else ga)
            for gc, ga in zip(clean_grads, adv_grads)  # noqa: B905
        ]
        self.optimizer.apply_gradients(zip(gradients, variables))  # noqa: B905
        self._track_loss((1.0 - w) * clean + w * adv, x)
        self.track_losses(clean=clean, adv=adv)
        self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    # ------------------------------------------------------------ config

    def get_config(self):
        return {
            **super().get_config(),
            "classifier": keras.saving.serialize_keras_object(self.classifier),
            "attack": None if self.attack is None else self.attack.get_config(),
            "adv_weight": self.adv_weight,
            "attack_mode": self.attack_mode,
            "seed": self.seed,
            "fused": self.fused,
            "check_inputs": self.check_inputs,
            "fused_batchnorm": self.fused_batchnorm,
            "batchnorm_momentum": self.batchnorm_momentum,
            "eps_ramp_steps": self.eps_ramp_steps,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(
            config["classifier"], custom_objects=custom_objects
        )
        return cls(**config)


def _fit_arguments(*args, **kwargs) -> Optional[dict[str, Any]]:
    """`keras.Model.fit`'s arguments by name; None when they do not bind
    (Keras's own fit reports that)."""
    import inspect

    try:
        return inspect.signature(keras.Model.fit).bind(None, *args, **kwargs).arguments
    except TypeError:
        return None


def _label_shape(arguments: Optional[dict]) -> Optional[tuple]:
    """The shape of the labels `fit` gets, from `y` or a dataset's element
    spec, with the batch axis None; else None."""
    if arguments is None:
        return None
    x, y = arguments.get("x"), arguments.get("y")
    if y is None and isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        if isinstance(spec, tuple) and len(spec) in (2, 3):
            y = spec[1]
    shape = getattr(y, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    return (None, *tuple(shape)[1:])


def _checked_arguments(
    attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
) -> Optional[Attack]:
    """Validates `AdversarialModel`'s arguments; returns the `Attack` (a
    config dict turned into one)."""
    from advtrain.models.batchnorm.policy import check_momentum

    check_momentum(batchnorm_momentum, "batchnorm_momentum")
    if isinstance(attack, dict):
        attack = Attack.from_config(attack)
    if attack is not None and not isinstance(attack, Attack):
        raise TypeError(
            "attack must be an advtrain.attacks.Attack or its config dict. "
            f"Received: attack={attack!r}"
        )
    number = isinstance(adv_weight, (int, float)) and not isinstance(adv_weight, bool)
    if not number or not 0 <= adv_weight <= 1:
        raise ArgumentError(
            "adv_weight",
            f"must be between 0.0 and 1.0. Received: adv_weight={adv_weight!r}",
        )
    if adv_weight > 0 and attack is None:
        raise ArgumentError(
            "attack", "adv_weight > 0 needs an attack. Received: attack=None"
        )
    if (
        isinstance(eps_ramp_steps, bool)
        or not isinstance(eps_ramp_steps, int)
        or eps_ramp_steps < 0
    ):
        raise ArgumentError(
            "eps_ramp_steps",
            f"must be an integer >= 0. Received: eps_ramp_steps={eps_ramp_steps!r}",
        )
    if eps_ramp_steps and (attack is None or attack.backend != "advtrain"):
        received = "attack=None" if attack is None else f"backend={attack.backend!r}"
        raise ArgumentError(
            "eps_ramp_steps",
            "eps_ramp_steps > 0 needs an attack on the advtrain backend. "
            f"Received: {received}",
        )
    if attack_mode not in ATTACK_MODES:
        raise ArgumentError(
            "attack_mode",
            f"must be one of {', '.join(ATTACK_MODES)}. "
            f"Received: attack_mode={attack_mode!r}",
        )
    return attack
