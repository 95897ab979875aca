"""Random tensors from one seeded generator: ``fl.random.set_seed(0)`` makes a run repeatable."""
from __future__ import annotations

import numpy as np

from . import dtypes
from .execute import defop, execute
from .tensor import Tensor, in_scope

__all__ = ["set_seed", "normal", "uniform", "truncated_normal", "shuffle"]

_generator = np.random.default_rng()


def set_seed(seed: int) -> None:
    """Reset the global generator: every random op after this repeats the same sequence."""
    global _generator
    _generator = np.random.default_rng(seed)


def generator(seed=None):
    """The global generator (``seed`` None: what ``set_seed`` last made), or a new one from ``seed``."""
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


def _draw(kind, shape, dtype, seed, **params):
    """Eagerly, the numbers; inside a graph, a node that draws new numbers each time the graph runs."""
    return execute(_RANDOM, (), {"kind": kind, "shape": _shape(shape), "dtype": np.dtype(dtype), "seed": seed,
                                 "params": params})


def _random_kernel(*, kind, shape, dtype, seed, params):
    rng = generator(seed)
    if kind == "normal":
        out = rng.normal(params["mean"], params["stddev"], shape)
    elif kind == "uniform":
        out = rng.uniform(params["minval"], params["maxval"], shape)
    elif kind == "integers":
        out = rng.integers(params["minval"], params["maxval"], shape)
    else:  # truncated normal: redraw anything beyond two standard deviations
        out = rng.standard_normal(shape)
        bad = np.abs(out) > 2
        while bad.any():
            out[bad] = rng.standard_normal(int(bad.sum()))
            bad = np.abs(out) > 2
        out = out * params["stddev"] + params["mean"]
    return out.astype(dtype)


_RANDOM = defop("random", _random_kernel, lambda *, kind, shape, dtype, seed, params: (shape, dtype), stateful=True,
                eager=lambda inputs, attrs: in_scope(Tensor(_random_kernel(**attrs))),   # here: this generator
                doc="Random numbers, drawn anew each time the graph runs.")


def normal(shape, mean=0.0, stddev=1.0, dtype=dtypes.float32, seed=None, name=None):
    """Samples from a normal distribution."""
    return _draw("normal", shape, _floating(dtype, "normal"), seed, mean=mean, stddev=stddev)


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=dtypes.float32, seed=None, name=None):
    """Normal samples, redrawn until each lies within two standard deviations of the mean."""
    return _draw("truncated", shape, _floating(dtype, "truncated_normal"), seed, mean=mean, stddev=stddev)


def uniform(shape, minval=0, maxval=None, dtype=dtypes.float32, seed=None, name=None):
    """Uniform samples in [minval, maxval) (maxval defaults to 1 for floats; required for ints)."""
    d = dtypes.as_dtype(dtype)
    if d.is_integer:
        if maxval is None:
            raise ValueError("random.uniform with an integer dtype needs maxval")
        return _draw("integers", shape, d.as_numpy_dtype, seed, minval=minval, maxval=maxval)
    if not d.is_floating:
        raise TypeError(f"random.uniform makes numbers, not {d.name}")
    return _draw("uniform", shape, d.as_numpy_dtype, seed, minval=minval, maxval=1.0 if maxval is None else maxval)


_SHUFFLE = defop("random_shuffle", lambda x, *, seed: x[generator(seed).permutation(x.shape[0])],
                 lambda x, *, seed: (tuple(x.shape), np.dtype(dtypes.numpy_dtype(x.dtype))), stateful=True,
                 doc="The input with its first axis randomly permuted, anew each time the graph runs.")


def shuffle(value, seed=None, name=None):
    """The tensor with its first axis randomly permuted."""
    return execute(_SHUFFLE, (value,), {"seed": seed})
