"""Image layers: Conv2D (a convolution computed as one matmul over image patches) and MaxPool2D.
Images are [batch, height, width, channels] (channels last, as TensorFlow's default)."""
from __future__ import annotations

from ....core.ops import math_ops, nn_ops
from .. import activations
from .base import Layer, static_shape

__all__ = ["Conv2D", "MaxPool2D", "MaxPooling2D"]


def _pair(value, what, layer):
    v = (value, value) if isinstance(value, int) else tuple(value)
    if len(v) != 2 or any(not isinstance(d, int) or d < 1 for d in v):
        raise ValueError(f"{layer}: {what} must be a positive int or two of them, got {value!r}")
    return v


def _padding(value, layer):
    p = str(value).lower()
    if p not in ("valid", "same"):
        raise ValueError(f"{layer}: padding must be 'valid' or 'same', got {value!r}")
    return p


def _out(size, k, s, padding):
    if size is None:
        return None
    return (size - k) // s + 1 if padding == "valid" else -(-size // s)


class _Image(Layer):
    def _check_input(self, x):
        shape = static_shape(x)
        if len(shape) != 4:
            hint = (" (reshape flat images first, e.g. Reshape((8, 8, 1)) for the 64 pixels of a digit)"
                    if len(shape) == 2 else "")
            raise self.input_error(x, f"expects 4-D images [batch, height, width, channels]{hint}")
        k = self._window
        if self.padding == "valid" and any(d is not None and d < w for d, w in zip(shape[1:3], k)):
            raise self.input_error(x, f"a {k[0]}x{k[1]} window does not fit images of {shape[1]}x{shape[2]} "
                                      "pixels with padding 'valid'")


class Conv2D(_Image):
    """``filters`` learned k x k filters slid over the image: output [batch, h', w', filters].

    >>> import flowlab as fl
    >>> fl.keras.layers.Conv2D(4, 3, padding="same")(fl.ones([2, 8, 8, 1])).shape
    TensorShape([2, 8, 8, 4])
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Conv2D: filters must be a whole number >= 1, got {filters!r}")
        self.filters = filters
        self.kernel_size = self._window = _pair(kernel_size, "kernel_size", "Conv2D")
        self.strides = _pair(strides, "strides", "Conv2D")
        self.padding = _padding(padding, "Conv2D")
        self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer

    def _check_input(self, x):
        super()._check_input(x)
        channels = static_shape(x)[-1]
        if self.built and channels is not None and channels != self.kernel.shape[2]:
            raise self.input_error(x, f"was built for images of {self.kernel.shape[2]} channels, the input has "
                                      f"{channels}")

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(f"Conv2D layer {self.name!r}: the number of input channels must be known")
        self.kernel = self.add_weight("kernel", (*self.kernel_size, channels, self.filters), self.kernel_initializer)
        self.bias = self.add_weight("bias", (self.filters,), self.bias_initializer) if self.use_bias else None

    def call(self, inputs):
        if inputs.dtype != self.dtype:
            inputs = math_ops.cast(inputs, self.dtype)
        y = nn_ops.conv2d(inputs, self.kernel, self.strides, self.padding.upper())
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        n, h, w, _ = input_shape
        return (n, _out(h, self.kernel_size[0], self.strides[0], self.padding),
                _out(w, self.kernel_size[1], self.strides[1], self.padding), self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": self.kernel_size,
                "strides": self.strides, "padding": self.padding,
                "activation": activations.serialize(self.activation), "use_bias": self.use_bias}


class MaxPool2D(_Image):
    """The largest value of each ``pool_size`` window (moved by ``strides``, default the pool size)."""

    def __init__(self, pool_size=2, strides=None, padding="valid", **kwargs):
        super().__init__(**kwargs)
        self.pool_size = self._window = _pair(pool_size, "pool_size", "MaxPool2D")
        self.strides = self.pool_size if strides is None else _pair(strides, "strides", "MaxPool2D")
        self.padding = _padding(padding, "MaxPool2D")

    def call(self, inputs):
        if not inputs.dtype.is_floating:
            inputs = math_ops.cast(inputs, self.dtype)
        return nn_ops.max_pool2d(inputs, self.pool_size, self.strides, self.padding.upper())

    def compute_output_shape(self, input_shape):
        n, h, w, c = input_shape
        return (n, _out(h, self.pool_size[0], self.strides[0], self.padding),
                _out(w, self.pool_size[1], self.strides[1], self.padding), c)

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides, "padding": self.padding}


MaxPooling2D = MaxPool2D
