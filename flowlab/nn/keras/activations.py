"""Activation functions by name: ``"relu"``, ``"softmax"``... (``get`` turns a name into the function)."""
from __future__ import annotations

from ...core.ops import math_ops, nn_ops

__all__ = ["get", "serialize", "relu", "sigmoid", "tanh", "softmax", "linear"]

relu = math_ops.relu
sigmoid = math_ops.sigmoid
tanh = math_ops.tanh


def softmax(x, axis=-1):
    """Each slice along ``axis`` turned into probabilities that sum to 1."""
    return nn_ops.softmax(x, axis=axis)


def linear(x):
    """The identity: no activation."""
    return x


_BY_NAME = {"relu": relu, "sigmoid": sigmoid, "tanh": tanh, "softmax": softmax, "linear": linear}


def get(identifier):
    """The activation function for a name, a function, or None (no activation)."""
    if identifier is None:
        return linear
    if callable(identifier):
        return identifier
    if isinstance(identifier, str) and identifier in _BY_NAME:
        return _BY_NAME[identifier]
    raise ValueError(f"unknown activation {identifier!r}; use one of {sorted(_BY_NAME)}, a function, or None")


def serialize(fn) -> str:
    """The name of an activation function (for summaries and configs)."""
    for name, f in _BY_NAME.items():
        if f is fn:
            return name
    return getattr(fn, "__name__", repr(fn))
