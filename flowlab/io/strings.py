"""``fl.string``: the dtype TensorFlow code names for byte strings (``tf.string``).

flowlab's tensors hold numbers and booleans only; a byte string is a Python ``bytes`` (a scalar: a
record read by ``TFRecordDataset``, a ``FixedLenFeature([], fl.string)``), and several of them are a
numpy array of dtype ``object`` holding ``bytes`` (a string feature with a shape, a batch of
records). ``fl.string`` is what names that kind in a feature spec; it is not a tensor dtype, so
``fl.constant(b"x")`` still fails with a message that says so.
"""
from __future__ import annotations

import numpy as np

from ..core.dtypes import DType

__all__ = ["string", "is_string"]


class _StringDType(DType):
    """The dtype of byte strings: compares equal to itself, ``"string"`` and ``bytes``."""
    __slots__ = ()

    def __init__(self):
        super().__init__(np.object_)
        self.name = "string"

    def __eq__(self, other):
        return other is self or other is bytes or other is np.bytes_ or (isinstance(other, str) and other == "string")

    def __hash__(self):
        return hash("flowlab.string")

    def __repr__(self):
        return "fl.string"

    def __reduce__(self):
        return _the_string, ()


def _the_string():
    return string


string = _StringDType()


def is_string(dtype) -> bool:
    """Whether ``dtype`` names byte strings (``fl.string``, ``"string"``, ``bytes``)."""
    return dtype is string or dtype is bytes or dtype is np.bytes_ or (isinstance(dtype, str) and dtype == "string")
