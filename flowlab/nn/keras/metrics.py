"""Metrics: numbers to watch while training, accumulated over an epoch.

A metric keeps running totals in Variables: ``update_state`` adds a batch (as graph nodes inside a
traced training step, so nothing leaves the graph per step), ``result()`` reads the value so far
and ``reset_state()`` starts over. ``fit`` resets every metric at the start of each epoch.
"""
from __future__ import annotations

import numpy as np

from ...core import dtypes
from ...core.ops import array_ops, math_ops, reduction_ops
from ...core.tensor import Tensor, Variable, convert_to_tensor, variable_creator_scope
from . import losses as _losses
from ...core.interpreters import init_scope

__all__ = ["Metric", "Mean", "MeanMetricWrapper", "Accuracy", "BinaryAccuracy", "CategoricalAccuracy",
           "SparseCategoricalAccuracy", "MeanSquaredError", "MeanAbsoluteError", "get"]

_F32 = dtypes.float32


def _tensor(x):
    return x if isinstance(x, Tensor) else convert_to_tensor(np.asarray(x))


class Metric:
    """Base class: subclasses make their variables with ``add_variable`` (float32 by default, as
    Keras keeps them) and give ``update_state`` and ``result``."""

    def __init__(self, name=None, dtype="float32"):
        self.name = name or type(self).__name__.lower()
        self.dtype = dtypes.as_dtype(dtype)
        self._variables: dict[str, Variable] = {}

    def add_variable(self, name, shape=(), dtype=_F32):
        # a metric accumulates in the process that updates it: never mirrored, nor placed on a ps task
        with init_scope(), variable_creator_scope(None):
            v = Variable(np.zeros(shape, dtypes.numpy_dtype(dtype)), trainable=False, name=f"{self.name}/{name}")
        self._variables[name] = v
        return v

    @property
    def variables(self):
        return list(self._variables.values())

    def _checkpoint_children(self) -> dict:
        return dict(self._variables)

    def update_state(self, *args, **kwargs):
        raise NotImplementedError

    def result(self):
        raise NotImplementedError

    def reset_state(self):
        """Start over: every variable back to zero."""
        for v in self._variables.values():
            v.assign(np.zeros(v.shape, v.dtype.as_numpy_dtype))

    def __call__(self, *args, **kwargs):
        """Update with one batch and return the result so far."""
        self.update_state(*args, **kwargs)
        return self.result()

    def get_config(self) -> dict:
        return {"name": self.name}

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"


class Mean(Metric):
    """The (weighted) mean of every value seen: ``total / count``.

    >>> import flowlab as fl
    >>> m = fl.keras.metrics.Mean()
    >>> m.update_state([1.0, 2.0]); m.update_state(6.0)
    >>> float(m.result())
    3.0
    """

    def __init__(self, name="mean", dtype="float32"):
        super().__init__(name, dtype)
        self.total = self.add_variable("total")
        self.count = self.add_variable("count")

    def update_state(self, values, sample_weight=None):
        values = _tensor(values)
        if values.dtype != _F32:
            values = math_ops.cast(values, _F32)
        if sample_weight is None:
            self.total.assign_add(reduction_ops.reduce_sum(values))
            self.count.assign_add(array_ops.size(values, out_type=_F32))
            return
        w = _tensor(sample_weight) if not isinstance(sample_weight, float) else np.float32(sample_weight)
        if isinstance(w, Tensor) and w.dtype != _F32:
            w = math_ops.cast(w, _F32)
        if not np.shape(w) and not tuple(values.shape):   # one value of weight w (a batch's mean loss)
            self.total.assign_add(values * w)
            self.count.assign_add(w)
            return
        if len(np.shape(w)) > len(tuple(values.shape)) and np.shape(w)[-1] == 1:
            w = array_ops.squeeze(w, -1)
        self.total.assign_add(reduction_ops.reduce_sum(values * w))
        self.count.assign_add(reduction_ops.reduce_sum(w * math_ops.ones_like(values)))   # w broadcast as values

    def result(self):
        """total / count (0 before any update)."""
        out = math_ops.divide(self.total, math_ops.maximum(self.count, 1e-30))
        return out if out.dtype == self.dtype else math_ops.cast(out, self.dtype)


class MeanMetricWrapper(Mean):
    """The mean over examples of ``fn(y_true, y_pred)`` (a function with one value per example)."""

    def __init__(self, fn, name=None, dtype="float32", **options):
        super().__init__(name or fn.__name__, dtype)
        self._fn, self._options = fn, options

    def update_state(self, y_true, y_pred, sample_weight=None):
        super().update_state(self._fn(y_true, y_pred, **self._options), sample_weight)


def _check_batch(name, y_true, y_pred, want_rank):
    st, sp = tuple(y_true.shape), tuple(y_pred.shape)
    if len(st) != want_rank or (st and sp and st[0] is not None and sp[0] is not None and st[0] != sp[0]):
        raise _losses.shape_error(name, y_true, y_pred, "y_true does not fit y_pred")


def sparse_categorical_accuracy(y_true, y_pred):
    """1.0 where the highest score is at the label's class, else 0.0 (one value per example)."""
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    st = tuple(y_true.shape)
    if len(st) == len(tuple(y_pred.shape)) and st and st[-1] == 1:
        y_true = array_ops.squeeze(y_true, -1)
    _check_batch("sparse_categorical_accuracy", y_true, y_pred, len(tuple(y_pred.shape)) - 1)
    guess = reduction_ops.argmax(y_pred, axis=-1, output_type=y_true.dtype if y_true.dtype.is_integer else dtypes.int64)
    if not y_true.dtype.is_integer:
        y_true = math_ops.cast(y_true, guess.dtype)
    return math_ops.cast(math_ops.equal(guess, y_true), dtypes.float32)


def categorical_accuracy(y_true, y_pred):
    """1.0 where the highest score is at the one-hot target's class, else 0.0."""
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    _check_batch("categorical_accuracy", y_true, y_pred, len(tuple(y_pred.shape)))
    return math_ops.cast(math_ops.equal(reduction_ops.argmax(y_pred, -1), reduction_ops.argmax(y_true, -1)),
                         dtypes.float32)


def binary_accuracy(y_true, y_pred, threshold=0.5):
    """1.0 where (y_pred > threshold) equals the 0/1 target, averaged over the last axis."""
    y_true, y_pred = _losses._same_shape("binary_accuracy", y_true, y_pred)
    hit = math_ops.equal(math_ops.cast(math_ops.greater(y_pred, threshold), y_pred.dtype), y_true)
    return reduction_ops.reduce_mean(math_ops.cast(hit, dtypes.float32), axis=-1)


def accuracy(y_true, y_pred):
    """1.0 where y_pred equals y_true exactly."""
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    if y_true.dtype != y_pred.dtype:
        y_true = math_ops.cast(y_true, y_pred.dtype)
    return math_ops.cast(math_ops.equal(y_true, y_pred), dtypes.float32)


class Accuracy(MeanMetricWrapper):
    def __init__(self, name="accuracy", dtype="float32"):
        super().__init__(accuracy, name, dtype)


class BinaryAccuracy(MeanMetricWrapper):
    def __init__(self, name="binary_accuracy", dtype="float32", threshold=0.5):
        super().__init__(binary_accuracy, name, dtype, threshold=threshold)


class CategoricalAccuracy(MeanMetricWrapper):
    def __init__(self, name="categorical_accuracy", dtype="float32"):
        super().__init__(categorical_accuracy, name, dtype)


class SparseCategoricalAccuracy(MeanMetricWrapper):
    """The share of examples whose highest score is at their integer label."""

    def __init__(self, name="sparse_categorical_accuracy", dtype="float32"):
        super().__init__(sparse_categorical_accuracy, name, dtype)


class MeanSquaredError(MeanMetricWrapper):
    def __init__(self, name="mean_squared_error", dtype="float32"):
        super().__init__(_losses.mean_squared_error, name, dtype)


class MeanAbsoluteError(MeanMetricWrapper):
    def __init__(self, name="mean_absolute_error", dtype="float32"):
        super().__init__(_losses.mean_absolute_error, name, dtype)


_BY_NAME = {"mse": MeanSquaredError, "mean_squared_error": MeanSquaredError, "mae": MeanAbsoluteError,
            "mean_absolute_error": MeanAbsoluteError, "sparse_categorical_accuracy": SparseCategoricalAccuracy,
            "categorical_accuracy": CategoricalAccuracy, "binary_accuracy": BinaryAccuracy}


def get(identifier, loss=None) -> Metric:
    """A metric from a name, a Metric, or a function ``fn(y_true, y_pred)``. ``"accuracy"`` (or
    ``"acc"``) picks the accuracy that fits ``loss``: sparse for integer labels, categorical for
    one-hot targets, binary for binary cross-entropy, exact equality otherwise."""
    if isinstance(identifier, Metric):
        return identifier
    if isinstance(identifier, str):
        if identifier in ("accuracy", "acc"):
            name = getattr(loss, "name", "")
            kind = {"sparse_categorical_crossentropy": SparseCategoricalAccuracy,
                    "categorical_crossentropy": CategoricalAccuracy,
                    "binary_crossentropy": BinaryAccuracy}.get(name, Accuracy)
            return kind(name=identifier)
        if identifier not in _BY_NAME:
            raise ValueError(f"unknown metric {identifier!r}; use 'accuracy', one of {sorted(_BY_NAME)}, "
                             "a Metric, or a function")
        return _BY_NAME[identifier](name=identifier)
    if isinstance(identifier, type) and issubclass(identifier, Metric):
        return identifier()
    if callable(identifier):
        return MeanMetricWrapper(identifier)
    raise TypeError(f"a metric must be a name, a Metric or a function, got {type(identifier).__name__}")
