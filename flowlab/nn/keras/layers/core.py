"""The everyday layers: Dense, Activation, Flatten, Reshape, Dropout."""
from __future__ import annotations

import math

import numpy as np

from ....core.ops import array_ops, math_ops, nn_ops
from .. import activations
from .base import Layer, static_shape

__all__ = ["Dense", "Activation", "Flatten", "Reshape", "Dropout"]


def _positive_int(value, what, layer):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{layer}: {what} must be a whole number >= 1, got {value!r}")
    return int(value)


class Dense(Layer):
    """``activation(inputs @ kernel + bias)``: every input feature connected to each of ``units``
    outputs. Takes 2-D inputs [batch, features]; put a Flatten before it for images.

    >>> import flowlab as fl
    >>> fl.keras.layers.Dense(3, activation="relu")(fl.ones([2, 4])).shape
    TensorShape([2, 3])
    """

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.units = _positive_int(units, "units", "Dense")
        self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer

    def _check_input(self, x):
        shape = static_shape(x)
        if len(shape) != 2:
            hint = " (add a Flatten() layer before it)" if len(shape) > 2 else ""
            raise self.input_error(x, f"expects a 2-D input [batch, features]{hint}")
        if self.built and shape[-1] is not None and shape[-1] != self._kernel_rows:
            raise self.input_error(x, f"was built for inputs of {self._kernel_rows} features, the input has "
                                      f"{shape[-1]}")

    def build(self, input_shape):
        features = input_shape[-1]
        if features is None:
            raise ValueError(f"Dense layer {self.name!r}: the number of input features must be known, "
                             f"got input shape {tuple(input_shape)}")
        self._kernel_rows = int(features)
        self.kernel = self.add_weight("kernel", (features, self.units), self.kernel_initializer)
        self.bias = self.add_weight("bias", (self.units,), self.bias_initializer) if self.use_bias else None

    def call(self, inputs):
        if inputs.dtype != self.dtype:          # integer inputs (e.g. counts) are cast, as Keras does
            inputs = math_ops.cast(inputs, self.dtype)
        y = inputs @ self.kernel
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return (*tuple(input_shape)[:-1], self.units)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": activations.serialize(self.activation),
                "use_bias": self.use_bias}


class Activation(Layer):
    """Applies an activation function (a name such as ``"relu"``, or a function) to its input."""

    def __init__(self, activation, **kwargs):
        super().__init__(**kwargs)
        self.activation = activations.get(activation)

    def call(self, inputs):
        return self.activation(inputs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "activation": activations.serialize(self.activation)}


class Flatten(Layer):
    """Reshapes [batch, d1, d2, ...] into [batch, d1 * d2 * ...]."""

    def _check_input(self, x):
        shape = static_shape(x)
        if len(shape) < 1:
            raise self.input_error(x, "expects an input with a batch axis")
        if any(d is None for d in shape[1:]):
            raise self.input_error(x, "needs every axis but the batch axis to have a known size")

    def call(self, inputs):
        rest = static_shape(inputs)[1:]
        return array_ops.reshape(inputs, [-1, math.prod(rest)])

    def compute_output_shape(self, input_shape):
        return (input_shape[0], math.prod(input_shape[1:]))


class Reshape(Layer):
    """Reshapes each example to ``target_shape`` (the batch axis stays; one entry may be -1)."""

    def __init__(self, target_shape, **kwargs):
        super().__init__(**kwargs)
        self.target_shape = tuple(int(d) for d in target_shape)

    def _check_input(self, x):
        shape = static_shape(x)
        if not shape or any(d is None for d in shape[1:]):
            raise self.input_error(x, "needs a batch axis and known sizes for the other axes")
        n = math.prod(shape[1:])
        known = math.prod(d for d in self.target_shape if d != -1)
        if (-1 in self.target_shape and n % known) or (-1 not in self.target_shape and n != known):
            raise self.input_error(x, f"cannot reshape {n} values per example into {self.target_shape}")

    def call(self, inputs):
        return array_ops.reshape(inputs, [-1, *self.compute_output_shape(static_shape(inputs))[1:]])

    def compute_output_shape(self, input_shape):
        n = math.prod(input_shape[1:])
        known = math.prod(d for d in self.target_shape if d != -1)
        return (input_shape[0], *[n // known if d == -1 else d for d in self.target_shape])

    def get_config(self):
        return {**super().get_config(), "target_shape": self.target_shape}


class Dropout(Layer):
    """While training, zeroes each input element with probability ``rate`` and scales the rest by
    1 / (1 - rate); outside training, passes inputs through unchanged. A new mask at every step,
    from flowlab's global generator, or from the layer's own when given a ``seed``."""

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= float(rate) < 1:
            raise ValueError(f"Dropout: rate must be in [0, 1), got {rate!r}")
        self.rate, self.seed = float(rate), seed
        self._rng = None if seed is None else np.random.default_rng(seed)

    def call(self, inputs, training=None):
        if not training or self.rate == 0:
            return inputs
        return nn_ops.dropout(inputs, self.rate, seed=self._rng)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
