"""Initial values for weights: Glorot (Xavier) and He schemes, constants and plain random draws.

An initializer is called as ``init(shape, dtype)`` and returns a numpy array. Random ones draw from
flowlab's global generator (``fl.random.set_seed`` makes a model's first weights repeatable) unless
given a ``seed``; they always run eagerly, also while a graph is being traced.
"""
from __future__ import annotations

import math

import numpy as np

from ...core import random as _random
from ...core.dtypes import numpy_dtype
from ...core.interpreters import init_scope

__all__ = ["Initializer", "Zeros", "Ones", "Constant", "RandomNormal", "RandomUniform", "GlorotUniform",
           "GlorotNormal", "HeNormal", "HeUniform", "get"]


def _fans(shape):
    """(fan_in, fan_out): for a dense kernel [in, out]; for a conv kernel [h, w, in, out] each
    input and output channel counts once per tap of the window."""
    if len(shape) < 1:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


class Initializer:
    """Base class: ``__call__(shape, dtype="float32") -> numpy array``."""

    def __call__(self, shape, dtype="float32"):
        raise NotImplementedError

    def get_config(self) -> dict:
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class Zeros(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.zeros(tuple(shape), numpy_dtype(dtype))


class Ones(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.ones(tuple(shape), numpy_dtype(dtype))


class Constant(Initializer):
    def __init__(self, value=0.0):
        self.value = value

    def __call__(self, shape, dtype="float32"):
        return np.full(tuple(shape), self.value, numpy_dtype(dtype))

    def get_config(self):
        return {"value": self.value}


class _Random(Initializer):
    def __init__(self, seed=None):
        self.seed = seed

    def _draw(self, kind, shape, dtype, **params):
        fn = {"normal": _random.normal, "uniform": _random.uniform, "truncated": _random.truncated_normal}[kind]
        with init_scope():
            return np.array(fn(tuple(shape), dtype=dtype, seed=self.seed, **params))

    def get_config(self):
        return {"seed": self.seed}


class RandomNormal(_Random):
    def __init__(self, mean=0.0, stddev=0.05, seed=None):
        super().__init__(seed)
        self.mean, self.stddev = mean, stddev

    def __call__(self, shape, dtype="float32"):
        return self._draw("normal", shape, dtype, mean=self.mean, stddev=self.stddev)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev, **super().get_config()}


class RandomUniform(_Random):
    def __init__(self, minval=-0.05, maxval=0.05, seed=None):
        super().__init__(seed)
        self.minval, self.maxval = minval, maxval

    def __call__(self, shape, dtype="float32"):
        return self._draw("uniform", shape, dtype, minval=self.minval, maxval=self.maxval)

    def get_config(self):
        return {"minval": self.minval, "maxval": self.maxval, **super().get_config()}


class _Scaled(_Random):
    """Variance ``scale / fan`` (fan: fan_in, or the mean of fan_in and fan_out), uniform or normal."""
    scale, mode, distribution = 1.0, "fan_avg", "uniform"

    def __call__(self, shape, dtype="float32"):
        fan_in, fan_out = _fans(tuple(shape))
        fan = fan_in if self.mode == "fan_in" else (fan_in + fan_out) / 2
        variance = self.scale / max(1.0, fan)
        if self.distribution == "uniform":
            limit = math.sqrt(3.0 * variance)
            return self._draw("uniform", shape, dtype, minval=-limit, maxval=limit)
        # a normal cut at two standard deviations has 0.8796 of the spread of an uncut one
        return self._draw("truncated", shape, dtype, mean=0.0, stddev=math.sqrt(variance) / 0.87962566103423978)


class GlorotUniform(_Scaled):
    """Uniform in [-l, l] with l = sqrt(6 / (fan_in + fan_out)): the default for kernels."""


class GlorotNormal(_Scaled):
    distribution = "normal"


class HeNormal(_Scaled):
    """Suits relu layers: variance 2 / fan_in."""
    scale, mode, distribution = 2.0, "fan_in", "normal"


class HeUniform(_Scaled):
    scale, mode = 2.0, "fan_in"


_BY_NAME = {"zeros": Zeros, "ones": Ones, "glorot_uniform": GlorotUniform, "glorot_normal": GlorotNormal,
            "he_normal": HeNormal, "he_uniform": HeUniform, "random_normal": RandomNormal,
            "random_uniform": RandomUniform}


def get(identifier) -> Initializer:
    """An initializer from a name (``"glorot_uniform"``), an instance, or a function of (shape, dtype)."""
    if isinstance(identifier, str):
        if identifier not in _BY_NAME:
            raise ValueError(f"unknown initializer {identifier!r}; use one of {sorted(_BY_NAME)}")
        return _BY_NAME[identifier]()
    if callable(identifier):
        return identifier
    raise TypeError(f"an initializer must be a name or a callable, got {type(identifier).__name__}")
