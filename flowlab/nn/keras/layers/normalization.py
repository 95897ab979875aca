"""BatchNormalization: normalize each feature with the batch's statistics while training and
with running averages of them afterwards."""
from __future__ import annotations

from ....core.ops import array_ops, math_ops, reduction_ops
from .base import Layer, static_shape

__all__ = ["BatchNormalization"]


class BatchNormalization(Layer):
    """``gamma * (x - mean) / sqrt(var + epsilon) + beta`` per feature (the last axis by default).

    While training, mean and var are the batch's (over every axis but ``axis``), and the moving
    averages follow them: ``moving = momentum * moving + (1 - momentum) * batch``. Otherwise the
    moving averages are used, so a prediction does not depend on the rest of its batch.
    """

    def __init__(self, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= momentum <= 1:
            raise ValueError(f"BatchNormalization: momentum must be in [0, 1], got {momentum!r}")
        self.axis, self.momentum, self.epsilon = int(axis), float(momentum), float(epsilon)
        self.center, self.scale = bool(center), bool(scale)

    def _check_input(self, x):
        rank = len(static_shape(x))
        if not -rank <= self.axis < rank or rank < 2:
            raise self.input_error(x, f"axis {self.axis} is not an axis of the input (besides the batch axis)")
        if self.built and static_shape(x)[self.axis] not in (None, self._features):
            raise self.input_error(x, f"was built for {self._features} features on axis {self.axis}")

    def build(self, input_shape):
        rank = len(input_shape)
        self._axis = self.axis % rank
        features = input_shape[self._axis]
        if features is None:
            raise ValueError(f"BatchNormalization layer {self.name!r}: axis {self.axis} needs a known size")
        self._features = int(features)
        self._reduce = tuple(i for i in range(rank) if i != self._axis)
        self._bshape = [1] * rank
        self._bshape[self._axis] = self._features
        shape = (self._features,)
        self.gamma = self.add_weight("gamma", shape, "ones") if self.scale else None
        self.beta = self.add_weight("beta", shape, "zeros") if self.center else None
        self.moving_mean = self.add_weight("moving_mean", shape, "zeros", trainable=False)
        self.moving_variance = self.add_weight("moving_variance", shape, "ones", trainable=False)

    def _broadcastable(self, v):
        if self._axis == len(self._bshape) - 1:
            return v
        return array_ops.reshape(v, self._bshape)

    def call(self, inputs, training=None):
        if training:
            mean = reduction_ops.reduce_mean(inputs, axis=self._reduce, keepdims=True)
            centered = inputs - mean
            var = reduction_ops.reduce_mean(math_ops.square(centered), axis=self._reduce, keepdims=True)
            m = 1.0 - self.momentum
            flat = [self._features]
            self.moving_mean.assign_sub((self.moving_mean - array_ops.reshape(mean, flat)) * m)
            self.moving_variance.assign_sub((self.moving_variance - array_ops.reshape(var, flat)) * m)
        else:
            mean, var = self._broadcastable(self.moving_mean), self._broadcastable(self.moving_variance)
            centered = inputs - mean
        y = centered / math_ops.sqrt(var + self.epsilon)
        if self.gamma is not None:
            y = y * self._broadcastable(self.gamma)
        if self.beta is not None:
            y = y + self._broadcastable(self.beta)
        return y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale}
