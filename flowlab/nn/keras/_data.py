"""What ``fit``, ``evaluate`` and ``predict`` take as data, turned into batches of numpy arrays.

Arrays (numpy, fl.Tensor, nested lists) are checked once (same number of examples in x, y and
sample weights; floats made float32), then each epoch is a permutation drawn from the fit's seed
and the epoch number, cut into batches; so epoch ``e`` has the same order in a resumed fit as in
the original one. A ``fl.data.Dataset`` is iterated once per epoch as it is; its elements are
``x``, ``(x, y)`` or ``(x, y, sample_weight)``, already batched.
"""
from __future__ import annotations

import math

import numpy as np

from ...core.errors import InvalidArgumentError, source_line
from ...core.tensor import Tensor
from ...data import Dataset

__all__ = ["ArrayData", "DatasetData", "adapt", "specs_of", "split_validation"]


def _error(what, message) -> InvalidArgumentError:
    where = source_line()
    return InvalidArgumentError(f"{what}: {message}" + (f"\n  at {where}" if where else ""), op=what, source=where)


def _array(value, name, what):
    if isinstance(value, Tensor):
        value = value.numpy()
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise _error(what, f"{name} cannot be read as an array: {e}") from None
    if a.dtype == object or a.dtype.kind in "USV":
        raise _error(what, f"{name} must hold numbers, got an array of {a.dtype}")
    if a.ndim == 0:
        raise _error(what, f"{name} must have one entry per example (axis 0), got a single value")
    if a.dtype.kind == "f" and a.dtype != np.float32:
        a = a.astype(np.float32)          # Keras's float type: float64 inputs would not fit float32 weights
    elif a.dtype.kind in "iu" and a.dtype.itemsize > 4 and a.size and (a.max() < 2**31 and a.min() >= -2**31):
        a = a.astype(np.int32)
    elif a.dtype == np.bool_:
        a = a.astype(np.float32)
    return a


class ArrayData:
    """In-memory arrays: ``x``, optional ``y`` and ``sample_weight``, all with the same length."""

    def __init__(self, x, y=None, sample_weight=None, batch_size=32, what="fit"):
        if isinstance(x, (list, tuple)) and x and isinstance(x[0], (np.ndarray, Tensor)) and y is None:
            raise _error(what, "x is a list of arrays; flowlab models take one input array")
        arrays = [_array(x, "x", what)]
        names = ["x"]
        if y is not None:
            arrays.append(_array(y, "y", what))
            names.append("y")
        if sample_weight is not None:
            arrays.append(_array(sample_weight, "sample_weight", what))
            names.append("sample_weight")
        lengths = {n: len(a) for n, a in zip(names, arrays)}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{n} has {k}" for n, k in lengths.items())
            raise _error(what, f"x, y and sample_weight must have the same number of examples (axis 0); {shown}")
        if batch_size is None:
            batch_size = 32
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise _error(what, f"batch_size must be a whole number >= 1, got {batch_size!r}")
        self.arrays = arrays
        self.n = len(arrays[0])
        if self.n == 0:
            raise _error(what, "x has no examples")
        self.batch_size = int(batch_size)
        self.steps = math.ceil(self.n / self.batch_size)
        self.has_y = y is not None

    def batches(self, seed=None, epoch=0, start=0):
        """The batches of one epoch from batch ``start``; shuffled by (seed, epoch) unless seed is None."""
        arrays = self.arrays
        if seed is not None:
            order = np.random.default_rng([int(seed) & 0x7FFFFFFFFFFFFFFF, int(epoch)]).permutation(self.n)
            arrays = [a[order] for a in arrays]
        bs = self.batch_size
        for i in range(start, self.steps):
            yield tuple(a[i * bs:(i + 1) * bs] for a in arrays)


class DatasetData:
    """A ``fl.data.Dataset`` of batches; iterated once per epoch. Nothing is read from it before the
    first epoch (its first batch gives the shapes the training step is traced for)."""

    has_y = None          # known from the first batch

    def __init__(self, dataset, what="fit"):
        self.dataset = dataset
        self.what = what
        self.steps = None      # known after the first full pass

    def batches(self, seed=None, epoch=0, start=0):
        iterator = iter(self.dataset)
        count = 0
        try:
            for element in iterator:
                count += 1
                if count <= start:
                    continue
                if isinstance(element, dict) or (isinstance(element, tuple) and not 1 <= len(element) <= 3):
                    raise _error(self.what, "dataset elements must be x, (x, y) or (x, y, sample_weight); got "
                                            + (f"a tuple of {len(element)}" if isinstance(element, tuple) else "a dict"))
                parts = element if isinstance(element, tuple) else (element,)
                yield tuple(_batch_array(p, self.what) for p in parts)
        finally:
            iterator.close()
        if start == 0:
            self.steps = count


def _batch_array(t, what):
    if isinstance(t, Tensor):
        a = t.numpy()
    else:
        a = np.asarray(t)
    if a.dtype.kind == "f" and a.dtype != np.float32:
        a = a.astype(np.float32)
    if a.ndim == 0:
        raise _error(what, "a dataset element is a single value; batch the dataset first (dataset.batch(32))")
    return a


def specs_of(batch):
    """(shape with None for the batch size, dtype) of each array of a batch."""
    return [((None, *a.shape[1:]), a.dtype) for a in batch]


def adapt(x, y=None, sample_weight=None, batch_size=None, what="fit"):
    """ArrayData or DatasetData for what the user passed."""
    if isinstance(x, Dataset):
        if y is not None:
            raise _error(what, "y must not be given when x is a dataset (its elements hold the targets)")
        if sample_weight is not None:
            raise _error(what, "sample_weight must not be given when x is a dataset (put it in its elements)")
        if batch_size is not None:
            raise _error(what, "batch_size must not be given when x is a dataset (batch the dataset instead)")
        return DatasetData(x, what)
    if x is None:
        raise _error(what, "x is missing")
    return ArrayData(x, y, sample_weight, batch_size, what)


def split_validation(x, y, sample_weight, validation_split):
    """The last ``validation_split`` of the examples held out for validation (before any shuffling,
    as Keras does): ``(x, y, sample_weight)`` to train on and the same to validate on."""
    if not 0 < validation_split < 1:
        raise _error("fit", f"validation_split must be between 0 and 1, got {validation_split!r}")
    if isinstance(x, Dataset):
        raise _error("fit", "validation_split works with arrays only; pass validation_data with a dataset")
    data = ArrayData(x, y, sample_weight, 1, "fit")      # checks the lengths and converts, once
    given = iter(data.arrays)
    arrays = [None if part is None else next(given) for part in (x, y, sample_weight)]
    n = data.n
    cut = int(n * (1 - validation_split))
    if cut in (0, n):
        raise _error("fit", f"validation_split={validation_split} leaves no examples on one side ({n} in all)")
    train = tuple(None if a is None else a[:cut] for a in arrays)
    val = tuple(None if a is None else a[cut:] for a in arrays)
    return train, val
