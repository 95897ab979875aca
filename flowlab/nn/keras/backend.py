"""``fl.keras.backend`` (``K`` in Keras code): the few global settings and helpers Keras programs
call through the backend module: default float type, fuzz factor, image layout, reading and
setting variables, and ``clear_session``.

>>> import flowlab as fl
>>> K = fl.keras.backend
>>> K.floatx(), K.epsilon(), K.image_data_format()
('float32', 1e-07, 'channels_last')
>>> v = fl.Variable([1.0, 2.0])
>>> K.set_value(v, [3.0, 4.0]); K.get_value(v).tolist()
[3.0, 4.0]
"""
from __future__ import annotations

import warnings

import numpy as np

from ...core import dtypes
from ...core.tensor import Tensor, Variable, convert_to_tensor

__all__ = ["clear_session", "floatx", "set_floatx", "epsilon", "set_epsilon", "image_data_format",
           "set_image_data_format", "get_value", "batch_get_value", "set_value", "batch_set_value", "eval",
           "int_shape", "ndim", "dtype", "set_session"]

_FLOATX = "float32"
_EPSILON = 1e-7


def clear_session():
    """Start naming layers afresh (``dense``, ``dense_1``... again), as Keras does between models built
    in one notebook. Existing models and their weights are untouched."""
    from .layers import base
    base._counters.clear()


def floatx() -> str:
    """The float type layers make their weights in: ``'float32'``."""
    return _FLOATX


def set_floatx(value):
    """Only ``'float32'`` is accepted: flowlab's layers make float32 weights. For another type, give
    each layer ``dtype=`` (``Dense(4, dtype="float64")``) and feed it inputs of that type."""
    name = dtypes.as_dtype(value).name
    if name != "float32":
        raise ValueError(f"set_floatx({value!r}): flowlab's layers always default to float32; pass dtype={name!r} "
                         f"to each layer instead")


def epsilon() -> float:
    """The small number added to avoid dividing by zero or taking log(0) (losses clip probabilities to
    [epsilon, 1 - epsilon])."""
    return _EPSILON


def set_epsilon(value):
    global _EPSILON
    _EPSILON = float(value)


def image_data_format() -> str:
    """``'channels_last'``: images are [batch, height, width, channels] (NHWC)."""
    return "channels_last"


def set_image_data_format(data_format):
    if data_format != "channels_last":
        raise ValueError(f"set_image_data_format({data_format!r}): flowlab's conv and pooling layers take "
                         "channels_last (NHWC) images only; transpose your data with fl.transpose(x, [0, 2, 3, 1])")


def get_value(x) -> np.ndarray:
    """The value of a variable or tensor as a numpy array."""
    return np.array(convert_to_tensor(x))


def batch_get_value(tensors) -> list:
    return [get_value(x) for x in tensors]


eval = get_value  # noqa: A001 - Keras's name


def set_value(x, value):
    """Assign ``value`` to the variable ``x``."""
    if not isinstance(x, Variable):
        raise TypeError(f"set_value: {type(x).__name__} is not a variable; only variables (a layer's weights, "
                        "an optimizer's learning_rate) can be set")
    x.assign(np.asarray(value, dtype=x.dtype.as_numpy_dtype))


def batch_set_value(pairs):
    for x, value in pairs:
        set_value(x, value)


def int_shape(x) -> tuple:
    """The shape as a tuple of ints (None where unknown)."""
    shape = x.shape if isinstance(x, Tensor) or hasattr(x, "shape") else convert_to_tensor(x).shape
    return tuple(None if d is None else int(d) for d in shape)


def ndim(x) -> int:
    return len(int_shape(x))


def dtype(x) -> str:
    return dtypes.as_dtype(x.dtype).name


def set_session(session):
    """Nothing to do: flowlab's Keras runs eagerly, with no global session. (TF1-era Keras code sets
    one to pass a ConfigProto, such as the GPU a Horovod rank should use; flowlab ignores it.)"""
    warnings.warn("keras.backend.set_session(): flowlab's Keras has no session, the call changes nothing; "
                  "you can remove it", stacklevel=2)
