"""Random tensors from one seeded generator: ``fl.random.set_seed(0)`` makes a run repeatable."""
from __future__ import annotations

import numpy as np

from . import dtypes
from .tensor import Tensor

__all__ = ["set_seed", "normal", "uniform", "truncated_normal", "shuffle"]

_generator = np.random.default_rng()


def set_seed(seed: int) -> None:
    """Reset the global generator: every random op after this repeats the same sequence."""
    global _generator
    _generator = np.random.default_rng(seed)


def _rng(seed):
    return _generator if seed is None else np.random.default_rng(seed)


def _shape(shape):
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)


def _floating(dtype, fn):
    d = dtypes.as_dtype(dtype)
    if not d.is_floating:
        raise TypeError(f"random.{fn} makes floating-point tensors, not {d.name}")
    return d.as_numpy_dtype


def normal(shape, mean=0.0, stddev=1.0, dtype=dtypes.float32, seed=None, name=None):
    """Samples from a normal distribution."""
    np_dtype = _floating(dtype, "normal")
    return Tensor(_rng(seed).normal(mean, stddev, _shape(shape)).astype(np_dtype))


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=dtypes.float32, seed=None, name=None):
    """Normal samples, redrawn until each lies within two standard deviations of the mean."""
    np_dtype = _floating(dtype, "truncated_normal")
    rng = _rng(seed)
    out = rng.standard_normal(_shape(shape))
    bad = np.abs(out) > 2
    while bad.any():
        out[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(out) > 2
    return Tensor((out * stddev + mean).astype(np_dtype))


def uniform(shape, minval=0, maxval=None, dtype=dtypes.float32, seed=None, name=None):
    """Uniform samples in [minval, maxval) (maxval defaults to 1 for floats; required for ints)."""
    d = dtypes.as_dtype(dtype)
    rng = _rng(seed)
    if d.is_integer:
        if maxval is None:
            raise ValueError("random.uniform with an integer dtype needs maxval")
        return Tensor(rng.integers(minval, maxval, _shape(shape)).astype(d.as_numpy_dtype))
    if not d.is_floating:
        raise TypeError(f"random.uniform makes numbers, not {d.name}")
    return Tensor(rng.uniform(minval, 1.0 if maxval is None else maxval, _shape(shape)).astype(d.as_numpy_dtype))


def shuffle(value, seed=None, name=None):
    """The tensor with its first axis randomly permuted."""
    v = np.asarray(value)
    return Tensor(v[_rng(seed).permutation(v.shape[0])])
