"""`AdversarialModel`: a keras.Model that trains on clean and adversarial loss."""

from __future__ import annotations

from typing import Any, Optional, Union

import keras
import tensorflow as tf
from keras.src.losses import loss as keras_loss

from advtrain.attacks import Attack

ATTACK_MODES = ("inference", "train")


@keras.saving.register_keras_serializable(package="advtrain")
class AdversarialModel(keras.Model):
    """Wraps a classifier; `fit` minimises a clean/adversarial loss mix.

    loss = (1 - adv_weight) * clean_loss + adv_weight * adversarial_loss,
    with the compiled loss (use `from_logits=True`: the classifier returns
    logits). Each step first generates adversarial examples with the
    classifier in inference mode (no BatchNorm statistics update, no
    dropout) and `stop_gradient`, then runs one training forward pass over
    the clean and adversarial batch together and applies the gradient. The
    step keeps Keras semantics: loss scaling under mixed precision, sample
    weights, compiled metrics (on the clean batch), `tf.distribute`
    reductions, `steps_per_execution`, and `.keras` saving.

    Metrics added to the compiled ones: `clean_loss`, `adv_loss` and
    `adv_accuracy` (accuracy on the adversarial batch).

    Research code overrides two small hooks:
    - `generate_adversarial(x, y)` returns the adversarial batch;
    - `adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)`
      returns the scalar training loss.
    `TRADES` in `advtrain.models.trades` is built that way.

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
        fused: single-step attacks only (FGSM, FGSM-RS): take the input
            gradient from the clean loss's own backward pass in training
            mode, so a step costs 2 forward + 2 backward passes, the
            minimum for a clean + adversarial loss. Trade-off: the attack
            then sees training-mode BatchNorm (batch statistics) and, with
            a random start, uses the clean-point gradient.

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
        fused: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if isinstance(attack, dict):
            attack = Attack.from_config(attack)
        if attack is not None and not isinstance(attack, Attack):
            raise TypeError(
                "attack must be an advtrain.attacks.Attack or its config dict. "
                f"Received: attack={attack!r}"
            )
        if not isinstance(adv_weight, (int, float)) or not 0 <= adv_weight <= 1:
            raise ValueError(
                "adv_weight must be between 0.0 and 1.0. "
                f"Received: adv_weight={adv_weight!r}"
            )
        if adv_weight > 0 and attack is None:
            raise ValueError("adv_weight > 0 needs an attack. Received: attack=None")
        if attack_mode not in ATTACK_MODES:
            raise ValueError(
                f"attack_mode must be one of {', '.join(ATTACK_MODES)}. "
                f"Received: attack_mode={attack_mode!r}"
            )
        if fused and (attack is None or not attack.single_step):
            raise ValueError(
                "fused=True needs a single-step attack (method fgsm or "
                f"fgsm_rs, backend advtrain). Received: attack={attack!r}"
            )
        self.classifier = classifier
        self.attack = attack
        self.fused = bool(fused)
        self.adv_weight = float(adv_weight)
        self.attack_mode = attack_mode
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.clean_loss_tracker = keras.metrics.Mean(name="clean_loss")
        self.adv_loss_tracker = keras.metrics.Mean(name="adv_loss")
        self.adv_accuracy = keras.metrics.SparseCategoricalAccuracy(name="adv_accuracy")
        # Share of input-gradient entries that are exactly zero: under
        # float16 an unscaled loss underflows and FGSM silently stops.
        self.zero_grad_tracker = keras.metrics.Mean(name="zero_grad_fraction")
        self._zero_grad = None

    def call(self, inputs, training=False):
        return self.classifier(inputs, training=training)

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
        set `needs_clean_logits`); `y_pred_adv` is None when it is 0. Each
        part uses the compiled loss, so regularisation losses count once.
        """
        w = self.adv_weight
        parts = []
        if y_pred is not None:
            clean = self._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight
            )
            self.clean_loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(clean)
            )
            parts.append((1.0 - w) * clean if y_pred_adv is not None else clean)
        if y_pred_adv is not None:
            adv = self._compute_loss(
                x=x_adv, y=y, y_pred=y_pred_adv, sample_weight=sample_weight
            )
            self.adv_loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(adv)
            )
            parts.append(w * adv if y_pred is not None else adv)
        return tf.add_n(parts)

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

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if self.fused and self.adv_weight > 0:
            return self._fused_train_step(x, y, sample_weight)
        x_adv = None
        if self.adv_weight > 0 or self.needs_clean_logits:
            x_adv = self.generate_adversarial(x, y)
            self._track_zero_gradients()
        with tf.GradientTape() as tape:
            y_pred, y_pred_adv = self._forward(x, x_adv)
            loss = self.adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
            self._loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(x)[0],
            )
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))  # noqa: B905 (traced: autograph)
        if y_pred_adv is not None:
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        if y_pred is None:
            # adv_weight == 1: clean metrics (and clean_loss, for the log)
            # from an inference pass; it takes no part in the gradient.
            y_pred = self(x, training=False)
            self.clean_loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(
                    self._compute_loss(
                        x=x,
                        y=y,
                        y_pred=y_pred,
                        sample_weight=sample_weight,
                        training=False,
                    )
                )
            )
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(self, data):
        """Clean loss and metrics as Keras computes them, plus the attack's
        `adv_loss` / `adv_accuracy` on the same batch, so validation
        reports robust accuracy (`val_adv_accuracy`)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        unscale = keras_loss.unscale_loss_for_distribution
        y_pred = self(x, training=False)
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        self._loss_tracker.update_state(unscale(loss), sample_weight=tf.shape(x)[0])
        self.clean_loss_tracker.update_state(unscale(loss))
        if self.attack is not None:
            x_adv = self.generate_adversarial(x, y)
            self._track_zero_gradients()
            y_pred_adv = self(x_adv, training=False)
            adv = self._compute_loss(
                x=x_adv,
                y=y,
                y_pred=y_pred_adv,
                sample_weight=sample_weight,
                training=False,
            )
            self.adv_loss_tracker.update_state(unscale(adv))
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _fused_train_step(self, x, y, sample_weight):
        """Clean pass gives weight and input gradients; then the adversarial
        pass. 2 forward + 2 backward passes; BatchNorm sees both batches
        in training mode (statistics updated twice per step)."""
        variables = self.trainable_variables
        w = self.adv_weight
        with tf.GradientTape() as tape:
            tape.watch(x)
            y_pred = self(x, training=True)
            clean = self._compute_loss(
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
            adv = self._compute_loss(
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
        loss = (1.0 - w) * clean + w * adv
        unscale = keras_loss.unscale_loss_for_distribution
        self._loss_tracker.update_state(unscale(loss), sample_weight=tf.shape(x)[0])
        self.clean_loss_tracker.update_state(unscale(clean))
        self.adv_loss_tracker.update_state(unscale(adv))
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
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(
            config["classifier"], custom_objects=custom_objects
        )
        return cls(**config)
