"""Parsing ``tf.train.Example`` records into tensors: ``fl.io.parse_single_example`` (one record) and
``fl.io.parse_example`` (a batch), with the feature specs ``FixedLenFeature``, ``VarLenFeature`` and
``FixedLenSequenceFeature``.

The records are decoded by the ``protobuf`` package (``flowlab/io/example.py``); this module only
turns the decoded value lists into arrays, checks them against the spec, and says what is wrong.

What a feature gives (``fl.string`` features: ``bytes`` for a scalar, else a numpy ``object``
array of ``bytes``, since flowlab tensors hold numbers only):

=========================================  ===========================  ==============================
spec                                       one record                   a batch of ``B`` records
=========================================  ===========================  ==============================
``FixedLenFeature(shape, dtype)``          ``shape``                    ``[B, *shape]``
``VarLenFeature(dtype)``                   ``[n]``: the values, dense   ``[B, max n]``, padded with 0
                                                                        (``b""`` for strings)
``FixedLenSequenceFeature(shape, dtype,    ``[n, *shape]``              ``[B, max n, *shape]``, padded
allow_missing=True)``                                                   with ``default_value`` or 0
=========================================  ===========================  ==============================

``VarLenFeature`` differs from TensorFlow here: TensorFlow gives a ``SparseTensor``, flowlab (which
has no sparse tensors) gives the dense tensor that ``tf.sparse.to_dense`` of it would give, padded
the same way. Values: ``fl.float32`` from a ``float_list``, ``fl.int64`` from an ``int64_list``,
``fl.string`` from a ``bytes_list``; cast after parsing for other dtypes.

>>> import flowlab as fl
>>> record = fl.train.Example(features=fl.train.Features(feature={
...     "x": fl.train.Feature(float_list=fl.train.FloatList(value=[1.0, 2.0])),
...     "id": fl.train.Feature(bytes_list=fl.train.BytesList(value=[b"a7"]))})).SerializeToString()
>>> parsed = fl.io.parse_single_example(record, {"x": fl.io.FixedLenFeature([2], fl.float32),
...                                              "id": fl.io.FixedLenFeature([], fl.string)})
>>> parsed["x"].numpy().tolist(), parsed["id"]
([1.0, 2.0], b'a7')
"""
from __future__ import annotations

import collections
import math

import numpy as np

from ..core import dtypes as _dtypes
from ..core.errors import InvalidArgumentError
from ..core.tensor import Tensor
from .example import message_class
from .strings import is_string, string

__all__ = ["FixedLenFeature", "VarLenFeature", "FixedLenSequenceFeature", "parse_single_example",
           "parse_example"]

_LIST_OF = {"float32": "float_list", "int64": "int64_list", "string": "bytes_list"}


def _feature_dtype(dtype, spec):
    if is_string(dtype):
        return string
    try:
        d = _dtypes.as_dtype(dtype)
    except TypeError:
        d = None
    if d is None or d.name not in ("float32", "int64"):
        raise TypeError(f"{spec}: dtype must be fl.float32, fl.int64 or fl.string (what an Example can hold: "
                        f"float_list, int64_list, bytes_list), got {dtype!r}; parse as one of those and cast after")
    return d


def _shape(shape, spec):
    if shape is None:
        raise TypeError(f"{spec}: shape is required ([] for a scalar)")
    dims = [shape] if isinstance(shape, int) else list(getattr(shape, "as_list", lambda: shape)())
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"{spec}: shape must be fully known, non-negative dimensions, got {shape!r} "
                         f"(for a variable number of values use VarLenFeature or FixedLenSequenceFeature)")
    return tuple(int(d) for d in dims)


class FixedLenFeature(collections.namedtuple("FixedLenFeature", ["shape", "dtype", "default_value"])):
    """A feature with exactly ``prod(shape)`` values in every record, parsed to ``shape``.

    ``default_value``: used when a record lacks the feature (same number of values as ``shape``, or
    one value for all); None means the feature is required, and a record without it is an error.
    """
    __slots__ = ()

    def __new__(cls, shape, dtype, default_value=None):
        dtype = _feature_dtype(dtype, "FixedLenFeature")
        shape = _shape(shape, "FixedLenFeature")
        return super().__new__(cls, shape, dtype, default_value)


class VarLenFeature(collections.namedtuple("VarLenFeature", ["dtype"])):
    """A feature with any number of values per record (none, too): a 1-D result, dense (see the
    module docstring for how this differs from TensorFlow's sparse result)."""
    __slots__ = ()

    def __new__(cls, dtype):
        return super().__new__(cls, _feature_dtype(dtype, "VarLenFeature"))


class FixedLenSequenceFeature(collections.namedtuple("FixedLenSequenceFeature",
                                                     ["shape", "dtype", "allow_missing", "default_value"])):
    """A feature holding any number of items of ``shape`` each, parsed to ``[n, *shape]``. In an
    Example it needs ``allow_missing=True`` (a missing feature gives ``n = 0``), as in TensorFlow;
    ``default_value`` (a scalar) pads the shorter records of a batch."""
    __slots__ = ()

    def __new__(cls, shape, dtype, allow_missing=False, default_value=None):
        dtype = _feature_dtype(dtype, "FixedLenSequenceFeature")
        shape = _shape(shape, "FixedLenSequenceFeature")
        return super().__new__(cls, shape, dtype, bool(allow_missing), default_value)


# -- one record ------------------------------------------------------------------------------------
def _records_name(names, i):
    return f"record {i}" if names is None else f"record {names[i]!r}"


def _decode(data, where):
    Example = message_class("Example")
    try:
        return Example.FromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, whichever implementation raised it
        raise InvalidArgumentError(
            f"{where}: could not parse {len(data)} bytes as a tf.train.Example ({type(e).__name__}: {e}); "
            f"is this a record of Examples (not a raw or flowlab record, not a compressed file read "
            f"without compression_type)?", op="ParseExample") from None


def _values(feature_map, key, spec, where):
    """The feature's values as a 1-D numpy array, or None when the record lacks it."""
    if key not in feature_map:
        return None
    feature = feature_map[key]
    kind = feature.WhichOneof("kind")
    want = _LIST_OF[spec.dtype.name]
    if kind is None:                       # present, but with no list set: no values
        return np.empty(0, object if spec.dtype is string else spec.dtype.as_numpy_dtype)
    if kind != want:
        raise InvalidArgumentError(
            f"{where}, feature {key!r}: the record holds a {kind} but the spec asks for {spec.dtype.name} "
            f"(a {want}); give the spec dtype={_DTYPE_OF[kind]}", op="ParseExample")
    values = getattr(feature, kind).value
    if spec.dtype is string:
        out = np.empty(len(values), object)
        out[:] = list(values)
        return out
    return np.array(values, dtype=spec.dtype.as_numpy_dtype)


_DTYPE_OF = {"float_list": "fl.float32", "int64_list": "fl.int64", "bytes_list": "fl.string"}


def _default(spec, key):
    dtype = object if spec.dtype is string else spec.dtype.as_numpy_dtype
    value = np.asarray(spec.default_value, dtype=dtype)
    count = math.prod(spec.shape)
    if value.size == count:
        return value.reshape(spec.shape)
    if value.size == 1:
        return np.full(spec.shape, value.reshape(()), dtype)
    raise ValueError(f"FixedLenFeature {key!r}: default_value has {value.size} values, the shape {list(spec.shape)} "
                     f"needs {count} (or give one value for all)")


def _fixed(values, spec, key, where):
    if values is None:
        if spec.default_value is None:
            raise InvalidArgumentError(
                f"{where}: feature {key!r} is required (FixedLenFeature without default_value) but the record "
                f"does not have it; give the spec a default_value, or use VarLenFeature", op="ParseExample")
        return _default(spec, key)
    count = math.prod(spec.shape)
    if values.size != count:
        raise InvalidArgumentError(
            f"{where}, feature {key!r}: the spec's shape {list(spec.shape)} needs {count} values, the record "
            f"has {values.size}; fix the shape, or use VarLenFeature for a varying count", op="ParseExample")
    return values.reshape(spec.shape)


def _sequence(values, spec, key, where):
    if values is None:
        if not spec.allow_missing:
            raise InvalidArgumentError(
                f"{where}: feature {key!r} is missing; FixedLenSequenceFeature in an Example needs "
                f"allow_missing=True", op="ParseExample")
        values = np.empty(0, object if spec.dtype is string else spec.dtype.as_numpy_dtype)
    item = math.prod(spec.shape)
    if item == 0 or values.size % item:
        raise InvalidArgumentError(
            f"{where}, feature {key!r}: {values.size} values do not split into items of shape {list(spec.shape)}",
            op="ParseExample")
    return values.reshape((values.size // item,) + spec.shape)


def _parse_one(data, features, where):
    feature_map = _decode(data, where).features.feature
    out = {}
    for key, spec in features.items():
        values = _values(feature_map, key, spec, where)
        if isinstance(spec, FixedLenFeature):
            out[key] = _fixed(values, spec, key, where)
        elif isinstance(spec, VarLenFeature):
            out[key] = values if values is not None else np.empty(
                0, object if spec.dtype is string else spec.dtype.as_numpy_dtype)
        else:
            out[key] = _sequence(values, spec, key, where)
    return out


def _check_features(features, op):
    if not isinstance(features, dict) or not features:
        raise TypeError(f"{op}: features must be a non-empty dict of name -> fl.io.FixedLenFeature / "
                        f"VarLenFeature / FixedLenSequenceFeature, got {features!r}")
    for key, spec in features.items():
        if not isinstance(spec, (FixedLenFeature, VarLenFeature, FixedLenSequenceFeature)):
            raise TypeError(f"{op}: feature {key!r} has spec {spec!r}; flowlab parses FixedLenFeature, "
                            f"VarLenFeature and FixedLenSequenceFeature (SparseFeature and RaggedFeature are "
                            f"not supported: read the indices and values as VarLenFeatures)")


def _as_record(value, op):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and isinstance(value[()], (bytes, np.bytes_)):
        return bytes(value[()])
    if isinstance(value, str):
        raise TypeError(f"{op}: a serialized record is bytes, not str; pass the bytes that "
                        f"SerializeToString() or TFRecordDataset gave")
    raise TypeError(f"{op}: takes one serialized record (bytes), got {type(value).__name__}"
                    + ("; for a batch of records use fl.io.parse_example" if isinstance(value, (list, tuple, np.ndarray))
                       else ""))


def _result(value, dtype):
    if dtype is string:
        return value[()] if value.ndim == 0 else value
    return Tensor(value)


def parse_single_example(serialized, features, example_names=None, name=None):
    """Parse one serialized ``tf.train.Example`` (``bytes``) into a dict of name -> tensor, one entry
    per spec in ``features`` (features of the record that are not in ``features`` are ignored).

    A record that is not an Example, a value list of the wrong kind, a count that does not fit a
    ``FixedLenFeature``'s shape, or a required feature that is missing raises
    ``fl.errors.InvalidArgumentError`` naming the feature. See the module docstring for what each
    kind of spec gives. ``name`` is accepted for TensorFlow compatibility and not used.
    """
    _check_features(features, "parse_single_example")
    record = _as_record(serialized, "parse_single_example")
    where = "parse_single_example" + (f" ({example_names!r})" if example_names is not None else "")
    parsed = _parse_one(record, features, where)
    return {key: _result(value, features[key].dtype) for key, value in parsed.items()}


def _records(serialized, op):
    if isinstance(serialized, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"{op}: takes a batch of serialized records (a list or 1-D array of bytes), got one "
                        f"record; use fl.io.parse_single_example for one")
    if isinstance(serialized, np.ndarray):
        if serialized.ndim != 1:
            raise ValueError(f"{op}: a batch of records must be 1-D, got shape {list(serialized.shape)}")
        serialized = serialized.tolist()
    try:
        items = list(serialized)
    except TypeError:
        raise TypeError(f"{op}: takes a list or 1-D array of serialized records (bytes), "
                        f"got {type(serialized).__name__}") from None
    return [_as_record(v, op) for v in items]


def _pad_stack(rows, spec):
    """Rows of different leading lengths as one [B, max, ...] array, padded."""
    is_str = spec.dtype is string
    dtype = object if is_str else spec.dtype.as_numpy_dtype
    longest = max((r.shape[0] for r in rows), default=0)
    tail = rows[0].shape[1:] if rows else tuple(getattr(spec, "shape", ()))
    fill = getattr(spec, "default_value", None)
    fill = (b"" if is_str else 0) if fill is None else fill
    out = np.empty((len(rows), longest) + tail, dtype)
    out[...] = fill
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
    return out


def parse_example(serialized, features, example_names=None, name=None):
    """Parse a batch of serialized ``tf.train.Example`` records (a list or 1-D array of ``bytes``, such
    as a batch of a ``TFRecordDataset``) into a dict of name -> batched tensor: ``[B, *shape]`` for a
    ``FixedLenFeature``; a ``VarLenFeature`` or ``FixedLenSequenceFeature`` is padded to the longest
    record of the batch (see the module docstring). ``example_names`` (one per record) name the
    records in error messages; ``name`` is accepted and not used.
    """
    _check_features(features, "parse_example")
    records = _records(serialized, "parse_example")
    if example_names is not None and len(example_names) != len(records):
        raise ValueError(f"parse_example: {len(example_names)} example_names for {len(records)} records")
    rows = [_parse_one(r, features, "parse_example, " + _records_name(example_names, i))
            for i, r in enumerate(records)]
    out = {}
    for key, spec in features.items():
        column = [row[key] for row in rows]
        if isinstance(spec, FixedLenFeature):
            dtype = object if spec.dtype is string else spec.dtype.as_numpy_dtype
            value = np.empty((len(column),) + spec.shape, dtype)
            for i, v in enumerate(column):
                value[i, ...] = v
        else:
            value = _pad_stack(column, spec)
        out[key] = value if spec.dtype is string else Tensor(value)
    return out
