"""Losses: how far predictions are from targets, as one number to minimize.

A loss object is called as ``loss(y_true, y_pred, sample_weight=None)`` and returns the mean over
the batch (``reduction="sum_over_batch_size"``; also ``"sum"`` and ``"none"``, or the same as
``Reduction.SUM_OVER_BATCH_SIZE``, ``SUM``, ``NONE`` and ``AUTO``). The functions
(``mean_squared_error``...) return one value per example. Targets and predictions whose shapes do
not fit raise an error that names the loss, both shapes and your line.

Cross-entropies take probabilities by default (the output of a softmax), as Keras's do; give
``from_logits=True`` when the model's last layer has no activation: that is faster and more exact.
"""
from __future__ import annotations

import numpy as np

from ...core import dtypes
from ...core.errors import InvalidArgumentError, describe, source_line
from ...core.ops import array_ops, math_ops, nn_ops, reduction_ops
from ...core.tensor import Tensor, convert_to_tensor
from . import backend

__all__ = ["Reduction", "Loss", "MeanSquaredError", "MeanAbsoluteError", "CategoricalCrossentropy",
           "SparseCategoricalCrossentropy", "BinaryCrossentropy", "mean_squared_error", "mean_absolute_error",
           "categorical_crossentropy", "sparse_categorical_crossentropy", "binary_crossentropy", "get", "mse",
           "mae"]



def _shape(x):
    return tuple(x.shape)


def shape_error(name, y_true, y_pred, why) -> InvalidArgumentError:
    where = source_line()
    return InvalidArgumentError(f"{name}: {why}; got y_true {describe(y_true)} and y_pred {describe(y_pred)}"
                                + (f"\n  at {where}" if where else ""), op=name, source=where)


def _fits(a, b):
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _tensor(x):
    return x if isinstance(x, Tensor) else convert_to_tensor(np.asarray(x))


def _same_shape(name, y_true, y_pred):
    """y_true shaped as y_pred and of its dtype; [batch] next to [batch, 1] is fitted, as Keras does."""
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    if not y_pred.dtype.is_floating:
        raise shape_error(name, y_true, y_pred, "y_pred must be floating-point")
    st, sp = _shape(y_true), _shape(y_pred)
    if len(st) == len(sp) - 1 and sp[-1] == 1:
        y_true = array_ops.expand_dims(y_true, -1)
    elif len(st) == len(sp) + 1 and st[-1] == 1:
        y_true = array_ops.squeeze(y_true, -1)
    if not _fits(_shape(y_true), sp):
        raise shape_error(name, y_true, y_pred, "y_true and y_pred must have the same shape")
    if y_true.dtype != y_pred.dtype:
        y_true = math_ops.cast(y_true, y_pred.dtype)
    return y_true, y_pred


def _probabilities(y_pred):
    p = y_pred / reduction_ops.reduce_sum(y_pred, axis=-1, keepdims=True)
    eps = backend.epsilon()
    return math_ops.minimum(math_ops.maximum(p, eps), 1.0 - eps)


# -- per-example functions ------------------------------------------------------------------
def mean_squared_error(y_true, y_pred):
    """mean((y_true - y_pred)^2) over the last axis: one value per example."""
    y_true, y_pred = _same_shape("mean_squared_error", y_true, y_pred)
    return reduction_ops.reduce_mean(math_ops.square(y_pred - y_true), axis=-1)


def mean_absolute_error(y_true, y_pred):
    """mean(|y_true - y_pred|) over the last axis."""
    y_true, y_pred = _same_shape("mean_absolute_error", y_true, y_pred)
    return reduction_ops.reduce_mean(math_ops.abs(y_pred - y_true), axis=-1)


def categorical_crossentropy(y_true, y_pred, from_logits=False):
    """-sum(y_true * log(p)) over classes, with y_true one-hot (or any distribution) per example."""
    name = "categorical_crossentropy"
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    if len(_shape(y_pred)) < 1 or not _fits(_shape(y_true), _shape(y_pred)):
        hint = (" (integer class ids need sparse_categorical_crossentropy)"
                if len(_shape(y_true)) == len(_shape(y_pred)) - 1 else "")
        raise shape_error(name, y_true, y_pred, f"y_true must be one-hot, shaped as y_pred [batch, classes]{hint}")
    y_true, y_pred = _same_shape(name, y_true, y_pred)
    if from_logits:
        return nn_ops.softmax_cross_entropy_with_logits(y_true, y_pred)
    return -reduction_ops.reduce_sum(y_true * math_ops.log(_probabilities(y_pred)), axis=-1)


def _sparse_inputs(y_true, y_pred):
    """Integer class ids [batch] and float scores [batch, classes], or the error that says why not."""
    name = "sparse_categorical_crossentropy"
    y_true, y_pred = _tensor(y_true), _tensor(y_pred)
    st, sp = _shape(y_true), _shape(y_pred)
    if not y_pred.dtype.is_floating or len(sp) < 1:
        raise shape_error(name, y_true, y_pred, "y_pred must be floating-point scores [batch, classes]")
    if len(st) == len(sp) and st and st[-1] == 1:
        y_true = array_ops.squeeze(y_true, -1)
        st = st[:-1]
    if not _fits(st, sp[:-1]):
        hint = (" (one-hot targets need categorical_crossentropy)" if _fits(st, sp) else "")
        raise shape_error(name, y_true, y_pred, f"y_true must hold one class id per example, shaped as y_pred "
                                                f"without its last axis{hint}")
    if not y_true.dtype.is_integer:
        y_true = math_ops.cast(y_true, dtypes.int32)
    return y_true, y_pred


def sparse_categorical_crossentropy(y_true, y_pred, from_logits=False):
    """-log(p[label]) per example, with y_true integer class ids [batch] (or [batch, 1])."""
    y_true, y_pred = _sparse_inputs(y_true, y_pred)
    logits = y_pred if from_logits else math_ops.log(_probabilities(y_pred))
    return nn_ops.sparse_softmax_cross_entropy_with_logits(y_true, logits)


def binary_crossentropy(y_true, y_pred, from_logits=False):
    """-(y log p + (1 - y) log(1 - p)), averaged over the last axis."""
    y_true, y_pred = _same_shape("binary_crossentropy", y_true, y_pred)
    if from_logits:   # max(z, 0) - z y + log(1 + exp(-|z|)): never overflows
        z = y_pred
        per = (math_ops.maximum(z, 0.0) - z * y_true + math_ops.log(1.0 + math_ops.exp(-math_ops.abs(z))))
    else:
        eps = backend.epsilon()
        p = math_ops.minimum(math_ops.maximum(y_pred, eps), 1.0 - eps)
        per = -(y_true * math_ops.log(p) + (1.0 - y_true) * math_ops.log(1.0 - p))
    return reduction_ops.reduce_mean(per, axis=-1)


mse = MSE = mean_squared_error
mae = MAE = mean_absolute_error


# -- loss objects -----------------------------------------------------------------------------
class Reduction:
    """How a loss object turns per-example values into its result. ``NONE``: the per-example values
    (what a custom loop under a strategy passes to ``fl.nn.compute_average_loss``); ``SUM``: their
    sum; ``SUM_OVER_BATCH_SIZE`` and ``AUTO`` (the default): their mean."""
    AUTO = "auto"
    NONE = "none"
    SUM = "sum"
    SUM_OVER_BATCH_SIZE = "sum_over_batch_size"

    @classmethod
    def all(cls):
        return (cls.AUTO, cls.NONE, cls.SUM, cls.SUM_OVER_BATCH_SIZE)

    @classmethod
    def validate(cls, key):
        if key not in cls.all():
            raise ValueError(f"reduction must be one of fl.keras.losses.Reduction.{{AUTO, NONE, SUM, "
                             f"SUM_OVER_BATCH_SIZE}} ({', '.join(map(repr, cls.all()))}), got {key!r}")


class Loss:
    """Base class: ``call(y_true, y_pred)`` gives per-example values; ``__call__`` weights and reduces them."""

    def __init__(self, reduction="sum_over_batch_size", name=None):
        try:
            Reduction.validate(reduction)
        except ValueError as e:
            raise ValueError(f"{type(self).__name__}: {e}") from None
        self.reduction = reduction
        self.name = name or type(self).__name__

    def call(self, y_true, y_pred):
        raise NotImplementedError

    def __call__(self, y_true, y_pred, sample_weight=None):
        values = self.call(y_true, y_pred)
        if sample_weight is not None:
            w = _tensor(sample_weight)
            if w.dtype != values.dtype:
                w = math_ops.cast(w, values.dtype)
            if len(_shape(w)) > len(_shape(values)) and _shape(w)[-1] == 1:
                w = array_ops.squeeze(w, -1)
            values = values * w
        if self.reduction == Reduction.NONE:
            return values
        if self.reduction == Reduction.SUM:
            return reduction_ops.reduce_sum(values)
        return reduction_ops.reduce_mean(values)     # SUM_OVER_BATCH_SIZE, AUTO

    def get_config(self) -> dict:
        return {"name": self.name, "reduction": self.reduction}

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_config().items())})"


class _Wrapper(Loss):
    fn = None

    def __init__(self, reduction="sum_over_batch_size", name=None, **options):
        super().__init__(reduction, name or self.fn.__name__)
        self._options = options

    def call(self, y_true, y_pred):
        return type(self).fn(y_true, y_pred, **self._options)

    def get_config(self):
        return {**super().get_config(), **self._options}


class MeanSquaredError(_Wrapper):
    """The mean over the batch of ``mean_squared_error``."""
    fn = staticmethod(mean_squared_error)

    def __init__(self, reduction="sum_over_batch_size", name="mean_squared_error"):
        super().__init__(reduction, name)


class MeanAbsoluteError(_Wrapper):
    fn = staticmethod(mean_absolute_error)

    def __init__(self, reduction="sum_over_batch_size", name="mean_absolute_error"):
        super().__init__(reduction, name)


class CategoricalCrossentropy(_Wrapper):
    """Cross-entropy against one-hot targets; ``from_logits=True`` for unnormalized scores."""
    fn = staticmethod(categorical_crossentropy)

    def __init__(self, from_logits=False, reduction="sum_over_batch_size", name="categorical_crossentropy"):
        super().__init__(reduction, name, from_logits=bool(from_logits))


class SparseCategoricalCrossentropy(_Wrapper):
    """Cross-entropy against integer class ids; ``from_logits=True`` for unnormalized scores.

    >>> import flowlab as fl
    >>> loss = fl.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    >>> round(float(loss([0, 1], fl.constant([[2.0, 0.0], [0.0, 2.0]]))), 4)
    0.1269
    """
    fn = staticmethod(sparse_categorical_crossentropy)

    def __init__(self, from_logits=False, reduction="sum_over_batch_size", name="sparse_categorical_crossentropy"):
        super().__init__(reduction, name, from_logits=bool(from_logits))

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None and self.reduction in ("sum_over_batch_size", "auto") and self._options["from_logits"]:
            y_true, y_pred = _sparse_inputs(y_true, y_pred)
            return nn_ops.sparse_softmax_cross_entropy_mean(y_true, y_pred)   # the mean as one op: faster
        return super().__call__(y_true, y_pred, sample_weight)


class BinaryCrossentropy(_Wrapper):
    fn = staticmethod(binary_crossentropy)

    def __init__(self, from_logits=False, reduction="sum_over_batch_size", name="binary_crossentropy"):
        super().__init__(reduction, name, from_logits=bool(from_logits))


class _FunctionLoss(Loss):
    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self._fn = fn

    def call(self, y_true, y_pred):
        return self._fn(y_true, y_pred)


_BY_NAME = {
    "mse": MeanSquaredError, "mean_squared_error": MeanSquaredError, "mae": MeanAbsoluteError,
    "mean_absolute_error": MeanAbsoluteError, "categorical_crossentropy": CategoricalCrossentropy,
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy, "binary_crossentropy": BinaryCrossentropy,
}


def get(identifier) -> Loss:
    """A loss object from a name (``"mse"``, ``"sparse_categorical_crossentropy"``...), a Loss, or a
    function ``fn(y_true, y_pred)`` returning per-example values."""
    if isinstance(identifier, Loss):
        return identifier
    if isinstance(identifier, str):
        if identifier not in _BY_NAME:
            raise ValueError(f"unknown loss {identifier!r}; use one of {sorted(_BY_NAME)}, a Loss, or a function")
        return _BY_NAME[identifier]()
    if isinstance(identifier, type) and issubclass(identifier, Loss):
        return identifier()
    if callable(identifier):
        return _FunctionLoss(identifier)
    raise TypeError(f"a loss must be a name, a Loss or a function, got {type(identifier).__name__}")
