"""Record files: length-prefixed, checksummed records (``fl.data.RecordWriter``, ``fl.data.RecordDataset``).

A record file is a stream of opaque byte strings ("records"), like TensorFlow's TFRecord. Every
byte that is read back is covered by a checksum, so a flipped bit, a torn write or a truncated
copy is *reported* (``DataLossError``, naming the file, the record's index and its byte offset)
or, under ``ignore_errors=True``, *skipped and counted*; it is never handed to the model as data.

File layout (all integers little-endian)::

    offset 0                                                      file header, 16 bytes
    +---------------------------------------+-----------+-----------+
    | magic  89 46 4C 52 45 43 0D 0A        | version   | hdr CRC   |
    | "\\x89FLREC\\r\\n" (8 bytes)             | u32 = 1   | u32       |
    +---------------------------------------+-----------+-----------+
    offset 16                                                     record 0
    +---------------------+-----------+--------------------------+-----------+
    | length              | len CRC   | payload                  | data CRC  |
    | u64 (8 bytes)       | u32       | `length` bytes           | u32       |
    +---------------------+-----------+--------------------------+-----------+
    offset 16 + (length0 + 16)                                    record 1
    +---------------------+-----------+--------------------------+-----------+
    | ...                                                                    |

    record overhead: 16 bytes; record i starts at 16 + sum(length_j + 16 for j < i)

Checksums: CRC-32 (IEEE 802.3 polynomial, ``zlib.crc32``; *not* CRC-32C), *masked* as TFRecord
masks its CRCs: ``((crc >> 15) | (crc << 17)) + 0xA282EAD8`` (mod 2**32). Masking keeps a CRC
of data that itself contains CRCs from being trivially valid, and makes the CRC of empty data
non-zero, so a run of zero bytes (what a file system may leave after a crash) never reads as a
valid empty record. ``hdr CRC`` covers the 12 bytes before it, ``len CRC`` covers the 8 length
bytes, ``data CRC`` covers the payload. CRC-32 detects every error burst of up to 32 bits, so
any single corrupted byte is always caught.

Reading rules, for ``ignore_errors=True`` (with ``ignore_errors=False`` each case raises):

* bad magic, unknown version, header CRC mismatch, or a file shorter than the header: the whole
  file is untrusted; it is skipped with a warning.
* length CRC mismatch: the length cannot be trusted, so the start of the next record is unknown;
  the *rest of that file* is skipped with a warning (counted as one skipped record).
* payload CRC mismatch: the length was verified by its own CRC, so the reader *resyncs* to the
  next record at ``offset + 16 + length`` and goes on; the bad record is counted and warned about.
* truncated record (the file ends inside the length, its CRC, the payload or the data CRC; or a
  CRC-verified length runs past the end of the file): the tail is skipped with a warning.

Every skip is counted in ``reader.skipped`` (and kept in ``reader.errors``) and emitted as a
``RecordSkippedWarning``.

Writing is append-only: a ``RecordWriter`` only ever adds bytes at the end of the file, so at
any instant the file on disk is a prefix of the intended stream. A crash mid-write therefore
leaves every earlier complete record readable and a truncated tail, which the reader reports as
"truncated record N at byte offset X". ``flush()`` hands buffered records to the OS;
``flush(sync=True)`` (or ``RecordWriter(path, sync=True)``) also fsyncs them to disk.

Examples: ``encode_example({"image": array, "label": 3})`` turns a dict of arrays, tensors,
numbers, bytes or str into one payload (no pickle: a JSON header naming each feature's dtype
and shape, then the raw buffers), and ``decode_example(payload)`` gives it back as a dict of
read-only numpy arrays that are zero-copy views into the payload (bytes and str features come
back as ``bytes`` / ``str``). Example payload layout::

    +------------+-------------+---------------------+-----------+---------+-----+---------+
    | "FLEX"     | json_len    | JSON header (utf-8) | zero pad  | buffer0 | pad | buffer1 |
    | 4 bytes    | u32         | json_len bytes      | to 8-byte | nbytes0 |     | ...     |
    +------------+-------------+---------------------+-----------+---------+-----+---------+
    JSON: {"v": 1, "features": [{"name": "image", "dtype": "float32", "shape": [28, 28],
                                  "offset": 96, "nbytes": 3136}, ...]}

Buffers are little-endian and C-contiguous, each starting at an 8-byte-aligned offset from the
payload start; ``dtype`` is one of bool, int8, int16, int32, int64, uint8, float16, float32,
float64, or the special kinds "bytes" and "str" (shape []).

>>> import os, tempfile
>>> import numpy as np
>>> from flowlab.data.records import RecordWriter, read_records, encode_example, decode_example
>>> path = os.path.join(tempfile.mkdtemp(), "demo.flrec")
>>> with RecordWriter(path) as w:
...     _ = w.write(b"hello")
...     _ = w.write({"x": np.arange(3, dtype=np.int32), "label": 7})
>>> recs = list(read_records(path))
>>> recs[0]
b'hello'
>>> ex = decode_example(recs[1])
>>> ex["x"].tolist(), int(ex["label"])
([0, 1, 2], 7)
"""
from __future__ import annotations

import json
import math
import os
import struct
import warnings
import zlib
from typing import Callable, NamedTuple

import numpy as np

from ..core.errors import DataLossError, InvalidArgumentError  # noqa: F401 - DataLossError is raised here
from ..core.function import TensorSpec
from ._compression import compression_name, open_for_reading, open_for_writing
from .dataset import Dataset

__all__ = ["DataLossError", "RecordSkippedWarning", "RecordWriter", "RecordReader", "RecordDataset",
           "read_records", "encode_example", "decode_example", "MAGIC", "VERSION", "HEADER_SIZE",
           "RECORD_OVERHEAD"]

MAGIC = b"\x89FLREC\r\n"          # non-ASCII first byte and CRLF: text-mode mangling breaks it visibly
VERSION = 1
HEADER_SIZE = 16                  # magic (8) + version (4) + header CRC (4)
RECORD_OVERHEAD = 16              # length (8) + length CRC (4) + data CRC (4)

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_LEN_AND_CRC = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8


def mask(crc: int) -> int:
    """A CRC masked as TFRecord masks its checksums (rotate right by 15 bits, add a constant)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data) -> int:
    """CRC-32 (zlib) of ``data``, masked as TFRecord masks its checksums."""
    return mask(zlib.crc32(data) & 0xFFFFFFFF)


class Framing(NamedTuple):
    """How one kind of record file frames its records (the layout of the module docstring, less
    what differs): ``header`` (written first; b"" for none, and then no header is checked),
    ``checksum(data) -> int`` (the masked CRC of ``data``), ``what`` (its name in messages) and
    ``op`` (the reader's name in errors). ``flowlab/data/tfrecord.py`` adds TensorFlow's framing."""
    header: bytes
    checksum: Callable
    what: str
    op: str


def _file_header() -> bytes:
    head = MAGIC + _U32.pack(VERSION)
    return head + _U32.pack(masked_crc(head))


#: flowlab's own record files: a 16-byte header, CRC-32 (zlib).
FLOWLAB_FRAMING = Framing(_file_header(), masked_crc, "flowlab record file", "RecordDataset")


# -- errors ------------------------------------------------------------------------------------
class RecordSkippedWarning(RuntimeWarning):
    """Emitted for every bad record or file skipped by a reader with ``ignore_errors=True``."""


def _loss(filename, offset, index, reason, detail="", op="RecordDataset", compression="") -> DataLossError:
    what = "file header" if index is None else f"record {index}"
    where = f"byte offset {offset} of the {compression}-decompressed stream" if compression else f"byte offset {offset}"
    msg = f"{reason} in {what} at {where} of {filename!r}"
    if detail:
        msg += f": {detail}"
    return DataLossError(msg, filename=filename, offset=offset, index=index, reason=reason, op=op)


# -- writing -----------------------------------------------------------------------------------
class RecordWriter:
    """Write records to a new file at ``path`` (an existing file is replaced).

    ``write(record)`` takes bytes-like data or a dict (encoded with ``encode_example``) and
    returns the byte offset where the record starts. Use it as a context manager, or call
    ``close()``. Writing is append-only, so after a crash the complete records already written
    stay readable; ``sync=True`` fsyncs after every ``flush()`` and on ``close()``.

    >>> import os, tempfile
    >>> from flowlab.data.records import RecordWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "a.flrec")
    >>> with RecordWriter(path) as w:
    ...     w.write(b"abc"), w.write(b"")
    (16, 35)
    """

    _framing = FLOWLAB_FRAMING

    def __init__(self, path, sync: bool = False, compression: str = "", compression_level=None):
        self.path = os.fspath(path)
        self.sync = bool(sync)
        self.records_written = 0
        self._checksum = self._framing.checksum
        self._file = None
        self._file = open_for_writing(self.path, compression_name(compression, "compression"), compression_level)
        self._file.write(self._framing.header)
        self._offset = len(self._framing.header)

    @property
    def closed(self) -> bool:
        return self._file is None

    @property
    def offset(self) -> int:
        """Bytes written so far (the offset the next record will start at)."""
        return self._offset

    def write(self, record) -> int:
        if self._file is None:
            raise ValueError(f"write to a closed {type(self).__name__} ({self.path!r})")
        if isinstance(record, dict):
            record = encode_example(record)
        elif isinstance(record, str):
            raise TypeError(f"{type(self).__name__}.write takes bytes or a dict of features, not str; "
                            "encode it first (text.encode('utf-8'))")
        try:
            payload = memoryview(record).cast("B")
        except TypeError:
            raise TypeError(f"{type(self).__name__}.write takes bytes-like data or a dict of features, "
                            f"not {type(record).__name__}") from None
        if not payload.c_contiguous:
            payload = memoryview(payload.tobytes())
        length = _U64.pack(payload.nbytes)
        start, checksum = self._offset, self._checksum
        # Prefix, payload, suffix: the file only ever grows at the end, so it is always a prefix
        # of the full stream and a torn write shows up as a truncated last record.
        self._file.write(length + _U32.pack(checksum(length)))
        self._file.write(payload)
        self._file.write(_U32.pack(checksum(payload)))
        self._offset += payload.nbytes + RECORD_OVERHEAD
        self.records_written += 1
        return start

    def flush(self, sync: bool | None = None):
        """Hand buffered records to the operating system (and fsync them to disk when ``sync``)."""
        if self._file is None:
            return
        self._file.flush()
        if self.sync if sync is None else sync:
            os.fsync(self._file.fileno())

    def close(self):
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self):
        state = "closed" if self._file is None else "open"
        return f"<{type(self).__name__} {self.path!r} {state}, {self.records_written} records, {self._offset} bytes>"


# -- reading -----------------------------------------------------------------------------------
class RecordReader:
    """An iterator over the payloads (``bytes``) of one record file; ``read_records`` makes one.

    ``skipped`` counts the records (and files) skipped under ``ignore_errors=True``; ``errors``
    holds the matching ``DataLossError`` objects. Closing it (or exhausting it) closes the file.
    """

    _framing = FLOWLAB_FRAMING

    def __init__(self, path, ignore_errors: bool = False, on_skip=None, compression: str = "", buffer_size=None):
        self.path = os.fspath(path)
        self.ignore_errors = bool(ignore_errors)
        self.compression = compression_name(compression, "compression")
        self.buffer_size = buffer_size
        self._on_skip = on_skip
        self.skipped = 0
        self.errors: list[DataLossError] = []
        self._gen = self._records()

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        return next(self._gen)

    def close(self):
        self._gen.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _bad(self, err: DataLossError):
        """Raise ``err``, or (under ignore_errors) count it and warn."""
        if not self.ignore_errors:
            raise err
        self.skipped += 1
        self.errors.append(err)
        if self._on_skip is not None:
            self._on_skip(err)
        warnings.warn(f"skipped: {err}", RecordSkippedWarning, stacklevel=4)

    def _loss(self, offset, index, reason, detail=""):
        return _loss(self.path, offset, index, reason, detail, self._framing.op, self.compression)

    def _records(self):
        try:
            f = open_for_reading(self.path, self.compression, self.buffer_size)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self._framing.op}: no such file {self.path!r}") from None
        with f:
            try:
                yield from self._read(f)
            except EOFError:                       # a compressed stream without its end marker
                if not self.compression:
                    raise
                self._bad(self._loss(self._offset, self._index, "truncated compressed stream",
                                     f"the {self.compression} stream ends early: the file is cut short, or its "
                                     f"writer has not been closed yet (records before this one were read)"))
            except (OSError, zlib.error) as e:     # a compressed stream that cannot be inflated
                if not self.compression or isinstance(e, FileNotFoundError):
                    raise
                self._bad(self._loss(self._offset, self._index, "corrupt compressed data",
                                     f"{type(e).__name__}: {e}; is the file really {self.compression}-compressed? "
                                     f"(pass the compression_type it was written with)"))

    def _read(self, f):
        framing, loss = self._framing, self._loss
        checksum = framing.checksum
        # The size bounds a CRC-verified length before reading it; a compressed stream's is unknown.
        size = None if self.compression else os.fstat(f.fileno()).st_size
        self._offset, self._index = 0, None
        if framing.header:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                self._bad(loss(0, None, "truncated file header",
                               f"the file has {len(head)} bytes, a record file starts with a "
                               f"{HEADER_SIZE}-byte header"))
                return
            if head[:8] != MAGIC:
                self._bad(loss(0, None, "bad magic bytes",
                               f"expected {MAGIC!r}, found {head[:8]!r}: not a {framing.what} (a TFRecord "
                               f"file written by TensorFlow? read it with fl.data.TFRecordDataset)"))
                return
            (stored,) = _U32.unpack_from(head, 12)
            if stored != checksum(head[:12]):
                self._bad(loss(0, None, "file header CRC mismatch",
                               f"stored {stored:#010x}, computed {checksum(head[:12]):#010x}"))
                return
            (version,) = _U32.unpack_from(head, 8)
            if version != VERSION:
                self._bad(loss(0, None, "unsupported version",
                               f"version {version}, this reader understands {VERSION}"))
                return

        offset, index = len(framing.header), 0
        while True:
            self._offset, self._index = offset, index
            prefix = f.read(12)
            if not prefix:
                return                               # clean end of file
            if len(prefix) < 12:
                self._bad(loss(offset, index, "truncated record",
                               f"the file ends {len(prefix)} bytes into the 12-byte length "
                               f"header" + (f" (file size {size})" if size is not None else "")))
                return
            length, stored = _LEN_AND_CRC.unpack(prefix)
            computed = checksum(prefix[:8])
            if stored != computed:
                self._bad(loss(offset, index, "length CRC mismatch",
                               f"stored {stored:#010x}, computed {computed:#010x}; the length "
                               f"cannot be trusted, so the rest of the file is unreadable"
                               + self._hint(offset)))
                return
            end = offset + RECORD_OVERHEAD + length
            if size is not None and end > size:
                self._bad(loss(offset, index, "truncated record",
                               f"the record needs {length + RECORD_OVERHEAD} bytes, but the "
                               f"file ends after {size - offset} (file size {size})"))
                return
            payload = f.read(length)
            suffix = f.read(4)
            if len(payload) < length or len(suffix) < 4:   # the file shrank while we read it
                self._bad(loss(offset, index, "truncated record",
                               f"the record needs {length + RECORD_OVERHEAD} bytes, but the stream "
                               f"ended after {12 + len(payload) + len(suffix)}"))
                return
            (stored,) = _U32.unpack(suffix)
            computed = checksum(payload)
            if stored != computed:
                # The length passed its own CRC, so the next record starts at ``end``: resync.
                self._bad(loss(offset, index, "payload CRC mismatch",
                               f"{length}-byte payload, stored {stored:#010x}, "
                               f"computed {computed:#010x}"))
            else:
                yield payload
            offset, index = end, index + 1

    def _hint(self, offset) -> str:
        """Why a first record may look corrupt: the file is of another kind, or compressed."""
        if offset != len(self._framing.header) or self.compression:
            return ""
        with open(self.path, "rb") as f:
            head = f.read(8)
        if head[:2] == b"\x1f\x8b":
            return "; the file starts like a GZIP file: pass compression_type='GZIP'"
        if head[:1] == b"\x78":
            return "; the file may be ZLIB-compressed: pass compression_type='ZLIB'"
        if head == MAGIC:
            return "; this is a flowlab record file: read it with fl.data.RecordDataset"
        return ""


def read_records(path, ignore_errors: bool = False) -> RecordReader:
    """Iterate over the payloads (``bytes``) of the record file ``path``, checking every CRC.

    Corruption or truncation raises ``DataLossError`` naming the file, the record index and its
    byte offset; with ``ignore_errors=True`` bad records are skipped (see the module docstring
    for when the reader can resync and when it must give up on the rest of the file), counted
    in the returned reader's ``skipped`` attribute and reported as ``RecordSkippedWarning``.
    """
    return RecordReader(path, ignore_errors=ignore_errors)


# -- examples: dicts of arrays as one payload -------------------------------------------------
_EXAMPLE_MAGIC = b"FLEX"
_EXAMPLE_VERSION = 1
_ALIGN = 8
_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in
           ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")}


def _pad(n: int) -> int:
    return -n % _ALIGN


def _as_feature(name, value):
    """(dtype name, shape, buffer) for one feature value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        buf = memoryview(value).cast("B") if memoryview(value).c_contiguous else memoryview(bytes(value))
        return "bytes", [], buf
    if isinstance(value, str):
        return "str", [], memoryview(value.encode("utf-8"))
    try:
        arr = np.asarray(value)             # fl.Tensor, numpy array or scalar, Python number, list
    except Exception as e:  # noqa: BLE001
        raise TypeError(f"encode_example: feature {name!r} ({type(value).__name__}) is not "
                        f"array-like: {e}") from None
    kind = "bool" if arr.dtype.kind == "b" else arr.dtype.name
    if kind not in _DTYPES:
        raise TypeError(f"encode_example: feature {name!r} has dtype {arr.dtype}; supported: "
                        f"{', '.join(_DTYPES)}, bytes and str")
    arr = np.array(arr, dtype=_DTYPES[kind], order="C", copy=None)     # little-endian, C order, any ndim
    return kind, list(arr.shape), memoryview(arr).cast("B") if arr.size else memoryview(b"")


def encode_example(features: dict) -> bytes:
    """One payload holding ``features`` (name -> array, tensor, number, bytes or str); no pickle.

    Python ints become int64 and floats float64 (lossless); use numpy scalars or arrays to choose
    another dtype. See the module docstring for the layout.
    """
    if not isinstance(features, dict):
        raise TypeError(f"encode_example takes a dict of name -> value, not {type(features).__name__}")
    specs, buffers = [], []
    for name, value in features.items():
        if not isinstance(name, str):
            raise TypeError(f"encode_example: feature names must be str, got {name!r}")
        kind, shape, buf = _as_feature(name, value)
        specs.append({"name": name, "dtype": kind, "shape": shape, "offset": 0, "nbytes": buf.nbytes})
        buffers.append(buf)

    # The offsets depend on the header length, which depends on the offsets' digits: iterate
    # until the layout is stable (two or three rounds at most).
    header = b""
    while True:
        pos = 8 + len(header)
        pos += _pad(pos)
        for spec in specs:
            spec["offset"] = pos
            pos += spec["nbytes"] + _pad(spec["nbytes"])
        new = json.dumps({"v": _EXAMPLE_VERSION, "features": specs}, separators=(",", ":"),
                         ensure_ascii=False).encode("utf-8")
        if new == header:
            break
        header = new

    out = bytearray(pos)
    out[0:4] = _EXAMPLE_MAGIC
    _U32.pack_into(out, 4, len(header))
    out[8:8 + len(header)] = header
    for spec, buf in zip(specs, buffers):
        out[spec["offset"]:spec["offset"] + spec["nbytes"]] = buf
    return bytes(out)


def _not_example(msg):
    return InvalidArgumentError(f"decode_example: not an encoded example: {msg}", op="decode_example")


def decode_example(payload) -> dict:
    """The features of an ``encode_example`` payload: name -> numpy array (a zero-copy view into
    ``payload``, read-only when ``payload`` is ``bytes``; a 0-d array for scalars), or ``bytes`` /
    ``str`` for those kinds. Raises ``InvalidArgumentError`` if the payload is not an example.
    """
    view = memoryview(payload).cast("B")
    n = view.nbytes
    if n < 8 or view[:4] != _EXAMPLE_MAGIC:
        raise _not_example(f"missing the 'FLEX' magic (payload of {n} bytes)")
    (hlen,) = _U32.unpack_from(view, 4)
    if 8 + hlen > n:
        raise _not_example(f"the JSON header ({hlen} bytes) runs past the payload ({n} bytes)")
    try:
        header = json.loads(bytes(view[8:8 + hlen]).decode("utf-8"))
        version, specs = header["v"], header["features"]
    except (ValueError, KeyError, TypeError) as e:
        raise _not_example(f"unreadable JSON header ({e})") from None
    if version != _EXAMPLE_VERSION:
        raise _not_example(f"example version {version!r}, this reader understands {_EXAMPLE_VERSION}")
    out = {}
    data_start = 8 + hlen
    for spec in specs if isinstance(specs, list) else [None]:
        try:
            name, kind, shape = spec["name"], spec["dtype"], tuple(spec["shape"])
            offset, nbytes = spec["offset"], spec["nbytes"]
        except (KeyError, TypeError):
            raise _not_example(f"malformed feature entry {spec!r}") from None
        if not (isinstance(name, str) and isinstance(kind, str) and all(type(d) is int and d >= 0 for d in shape)
                and type(offset) is int and type(nbytes) is int and nbytes >= 0
                and data_start <= offset and offset + nbytes <= n):
            raise _not_example(f"feature entry {spec!r} is malformed or out of bounds (payload of {n} bytes)")
        if name in out:
            raise _not_example(f"feature {name!r} appears twice")
        if kind in ("bytes", "str"):
            raw = bytes(view[offset:offset + nbytes])
            if kind == "str":
                try:
                    raw = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise _not_example(f"feature {name!r}: {e}") from None
            out[name] = raw
            continue
        dtype = _DTYPES.get(kind)
        if dtype is None:
            raise _not_example(f"feature {name!r} has unknown dtype {kind!r}")
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes:
            raise _not_example(f"feature {name!r}: {nbytes} bytes do not hold {kind}{list(shape)}")
        if count == 0:
            arr = np.empty(shape, dtype=dtype)
            arr.flags.writeable = False
        else:
            arr = np.frombuffer(view, dtype=dtype, count=count, offset=offset).reshape(shape)
        if kind == "bool" and count and np.any(arr.view(np.uint8) > 1):
            raise _not_example(f"bool feature {name!r} holds bytes other than 0 and 1")
        out[name] = arr
    return out


# -- the dataset -------------------------------------------------------------------------------
def _filename(item) -> str:
    """A path from str, bytes, os.PathLike, a numpy string or a 0-d array/tensor holding one."""
    if isinstance(item, np.ndarray) and item.ndim == 0:
        item = item[()]
    if hasattr(item, "numpy") and not isinstance(item, (str, bytes)):
        item = item.numpy()
        if isinstance(item, np.ndarray) and item.ndim == 0:
            item = item[()]
    if isinstance(item, (bytes, np.bytes_)):
        return os.fsdecode(bytes(item))
    return os.fspath(str(item) if isinstance(item, np.str_) else item)


def _filenames(filenames):
    if isinstance(filenames, (str, bytes, os.PathLike, np.str_, np.bytes_)):
        return [filenames]
    if isinstance(filenames, np.ndarray):
        return list(filenames.reshape(-1)) if filenames.ndim else [filenames]
    return filenames          # a list or tuple, or anything iterable again (e.g. a Dataset of names)


def _iter_records(filenames, ignore_errors, decode, stats, reader=None, compression="", buffer_size=None):
    """Payloads (or decoded examples) of every file in order; skips are recorded in ``stats``."""
    def skipped(err):
        stats["skipped"] += 1
        stats["errors"].append(err)

    for item in filenames:
        name = _filename(item)
        with (reader or RecordReader)(name, ignore_errors=ignore_errors, on_skip=skipped,
                                      compression=compression, buffer_size=buffer_size) as reader_:
            for payload in reader_:
                if not decode:
                    yield payload
                    continue
                try:
                    example = decode_example(payload)
                except InvalidArgumentError as e:
                    raise InvalidArgumentError(f"{e} (a record of {name!r})", op="RecordDataset") from None
                yield _to_tensors(example)


def _to_tensors(example: dict) -> dict:
    from ..core.tensor import convert_to_tensor
    return {k: v if isinstance(v, (bytes, str)) else convert_to_tensor(v) for k, v in example.items()}


class RecordDataset(Dataset):
    """Records from one or more record files, read in order (``fl.data.RecordDataset``).

    Elements are the payloads as Python ``bytes`` (not ``np.bytes_``: numpy strips trailing NUL
    bytes, which would silently change a payload), or, with ``decode=True``, the dicts written by
    ``RecordWriter.write(dict)`` with every array feature as an ``fl.Tensor`` (bytes and str
    features stay ``bytes`` / ``str``). ``filenames``: one path, or a list of paths (str, bytes,
    os.PathLike, or string tensors/arrays), or any re-iterable of them such as a dataset of names.

    A corrupted or truncated record raises ``DataLossError`` naming the file, the record index and
    its byte offset. ``ignore_errors=True`` skips bad records instead (resyncing where the length
    is trustworthy, else dropping the rest of that file; see the module docstring), warns with
    ``RecordSkippedWarning`` and counts them in ``skipped``.

    >>> import os, tempfile
    >>> import numpy as np
    >>> from flowlab.data.records import RecordDataset, RecordWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "ex.flrec")
    >>> with RecordWriter(path) as w:
    ...     for i in range(3):
    ...         _ = w.write({"x": np.full([2], i, np.float32), "y": np.int64(i)})
    >>> [(e["x"].numpy().tolist(), int(e["y"])) for e in RecordDataset(path, decode=True)]
    [([0.0, 0.0], 0), ([1.0, 1.0], 1), ([2.0, 2.0], 2)]
    """

    def __init__(self, filenames, ignore_errors: bool = False, decode: bool = False):
        self._filenames = _filenames(filenames)
        self._ignore_errors = bool(ignore_errors)
        self._decode = bool(decode)
        self._stats = {"skipped": 0, "errors": []}

    @property
    def skipped(self) -> int:
        """Records (and files) skipped so far under ``ignore_errors=True``, over all iterations."""
        return self._stats["skipped"]

    @property
    def skipped_errors(self) -> list:
        """The ``DataLossError`` of every skip counted in ``skipped``."""
        return list(self._stats["errors"])

    def _make_iterator(self):
        return _iter_records(self._filenames, self._ignore_errors, self._decode, self._stats)

    def _compute_element_spec(self):
        # flowlab has no string dtype: a raw payload's spec is the Python type ``bytes``, as is a
        # bytes or str feature's; array features get an ``fl.TensorSpec``.
        if not self._decode:
            return bytes
        iterator = self._make_iterator()
        try:
            first = next(iterator, None)
        finally:
            iterator.close()
        if first is None:
            raise ValueError("RecordDataset: element_spec of an empty dataset is unknown")
        return {k: type(v) if isinstance(v, (bytes, str)) else TensorSpec(v.shape, v.dtype)
                for k, v in first.items()}

    def __repr__(self):
        names = self._filenames if isinstance(self._filenames, (list, tuple)) else "..."
        return f"<RecordDataset {names!r}{' decode' if self._decode else ''}>"
