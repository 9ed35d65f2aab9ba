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
            raise ValueError(
                "adv_weight > 0 needs an attack. Received: attack=None"
            )
        if attack_mode not in ATTACK_MODES:
            raise ValueError(
                f"attack_mode must be one of {', '.join(ATTACK_MODES)}. "
                f"Received: attack_mode={attack_mode!r}"
            )
        self.classifier = classifier
        self.attack = attack
        self.adv_weight = float(adv_weight)
        self.attack_mode = attack_mode
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.clean_loss_tracker = keras.metrics.Mean(name="clean_loss")
        self.adv_loss_tracker = keras.metrics.Mean(name="adv_loss")
        self.adv_accuracy = keras.metrics.SparseCategoricalAccuracy(
            name="adv_accuracy"
        )

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
        x_adv = self.attack(
            self.attack_model_fn,
            x,
            y,
            loss_scale=self.attack_loss_scale(),
            seed=self.seed_generator,
        )
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

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        x_adv = None
        if self.adv_weight > 0 or self.needs_clean_logits:
            x_adv = self.generate_adversarial(x, y)
        with tf.GradientTape() as tape:
            y_pred, y_pred_adv = self._forward(x, x_adv)
            loss = self.adversarial_loss(
                x, y, y_pred, x_adv, y_pred_adv, sample_weight
            )
            self._loss_tracker.update_state(
                keras_loss.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(x)[0],
            )
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))
        if y_pred_adv is not None:
            self.adv_accuracy.update_state(y, y_pred_adv, sample_weight)
        if y_pred is None:
            # adv_weight == 1: clean metrics from an inference pass.
            y_pred = self(x, training=False)
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
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["classifier"] = keras.saving.deserialize_keras_object(
            config["classifier"], custom_objects=custom_objects
        )
        return cls(**config)
