"""TensorFlow's record files (TFRecord): ``fl.data.TFRecordDataset`` reads them, ``fl.io.TFRecordWriter``
writes them, byte for byte as TensorFlow does, so files move between flowlab and TensorFlow both ways.

A TFRecord file is flowlab's record layout (``records.py``) without the 16-byte file header and with
CRC-32C (the Castagnoli polynomial, as in iSCSI) instead of zlib's CRC-32. Each record::

    +---------------------+------------------+--------------------------+------------------+
    | length              | masked CRC-32C   | data                     | masked CRC-32C   |
    | u64 little-endian   | of the 8 length  | `length` bytes           | of the data      |
    |                     | bytes (u32 LE)   |                          | (u32 LE)         |
    +---------------------+------------------+--------------------------+------------------+

The CRCs are masked as in ``records.mask``. The whole stream may be compressed: ``"GZIP"`` or
``"ZLIB"`` (see ``_compression.py``); offsets in errors then count bytes of the decompressed stream.
The reading rules (what is raised, what ``ignore_errors=True`` skips) are those of ``records.py``:
one reader loop serves both kinds of file, given their ``Framing``.

CRC-32C comes from the ``google-crc32c`` package (Google's C library, with hardware CRC32C where the
CPU has it: several GB/s, so checking costs next to nothing beside reading the file).

>>> import os, tempfile
>>> import flowlab as fl
>>> path = os.path.join(tempfile.mkdtemp(), "demo.tfrecord")
>>> with fl.io.TFRecordWriter(path) as writer:
...     writer.write(b"first")
...     writer.write(b"second")
>>> list(fl.data.TFRecordDataset(path))
[b'first', b'second']
"""
from __future__ import annotations

import os

import numpy as np

from ._compression import compression_name
from .dataset import Dataset
from .options import AUTOTUNE, resolve_parallelism, Options
from .records import Framing, RecordDataset, RecordReader, RecordWriter, _iter_records, mask

__all__ = ["TFRecordDataset", "TFRecordWriter", "TFRecordOptions", "TFRecordCompressionType",
           "TFRECORD_FRAMING", "crc32c", "masked_crc32c"]


def _load_crc32c():
    try:
        import google_crc32c
    except ImportError:
        raise ImportError("TFRecord files need CRC-32C from the 'google-crc32c' package, a dependency of "
                          "flowlab: pip install google-crc32c") from None
    return google_crc32c.value


_crc32c = None


def _readonly(data):
    """``data`` as something google_crc32c takes without a copy (it refuses memoryview and bytearray)."""
    if type(data) is bytes:
        return data
    view = np.frombuffer(data, np.uint8)
    view.flags.writeable = False
    return view


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of ``data``, unmasked. ``crc32c(b"123456789") == 0xE3069283``."""
    global _crc32c
    if _crc32c is None:
        _crc32c = _load_crc32c()
    return _crc32c(_readonly(data))


def masked_crc32c(data) -> int:
    """The masked CRC-32C that a TFRecord file stores after a length and after the data."""
    global _crc32c
    if _crc32c is None:
        _crc32c = _load_crc32c()
    return mask(_crc32c(data if type(data) is bytes else _readonly(data)))


#: TensorFlow's framing: no header, masked CRC-32C.
TFRECORD_FRAMING = Framing(b"", masked_crc32c, "TFRecord file", "TFRecordDataset")


class TFRecordCompressionType:
    """The compression names TensorFlow's ``tf.io.TFRecordCompressionType`` holds."""
    NONE = ""
    ZLIB = "ZLIB"
    GZIP = "GZIP"


class TFRecordOptions:
    """How a TFRecord file is compressed (``fl.io.TFRecordOptions``): ``compression_type`` None, "",
    "GZIP" or "ZLIB", and ``compression_level`` (0-9; None: zlib's default). TensorFlow's tuning
    fields (buffer sizes, window bits, memory level, strategy, flush mode) are not offered: the
    files flowlab writes use zlib's defaults, which is what TensorFlow's defaults are too."""

    def __init__(self, compression_type=None, compression_level=None):
        self.compression_type = compression_name(compression_type)
        if compression_level is not None and not (isinstance(compression_level, int) and -1 <= compression_level <= 9):
            raise ValueError(f"TFRecordOptions: compression_level must be an int from 0 to 9 (or None), "
                             f"got {compression_level!r}")
        self.compression_level = compression_level

    @classmethod
    def get_compression_type_string(cls, options) -> str:
        """``options`` (None, a name, or TFRecordOptions) as "", "GZIP" or "ZLIB"."""
        if isinstance(options, TFRecordOptions):
            return options.compression_type
        return compression_name(options)

    def __repr__(self):
        return f"TFRecordOptions(compression_type={self.compression_type!r}, compression_level={self.compression_level!r})"


def _options(options) -> TFRecordOptions:
    return options if isinstance(options, TFRecordOptions) else TFRecordOptions(options)


class TFRecordReader(RecordReader):
    """The records (``bytes``) of one TFRecord file; ``fl.io.tf_record_iterator`` makes one."""
    _framing = TFRECORD_FRAMING


class TFRecordWriter(RecordWriter):
    """Write a TFRecord file at ``path`` (replacing one), as ``tf.io.TFRecordWriter`` does.

    ``options``: None, "GZIP", "ZLIB" or an ``fl.io.TFRecordOptions``. ``write(record)`` takes bytes
    (a serialized ``fl.train.Example``: ``example.SerializeToString()``). ``flush()`` hands what is
    written to the operating system (for a compressed file, everything written so far becomes
    readable); ``close()`` finishes the file. A context manager closes it on exit.

    >>> import os, tempfile
    >>> import flowlab as fl
    >>> path = os.path.join(tempfile.mkdtemp(), "demo.tfrecord.gz")
    >>> with fl.io.TFRecordWriter(path, options="GZIP") as w:
    ...     w.write(b"abc")
    >>> list(fl.data.TFRecordDataset(path, compression_type="GZIP"))
    [b'abc']
    """
    _framing = TFRECORD_FRAMING

    def __init__(self, path, options=None):
        opts = _options(options)
        self.options = opts
        super().__init__(path, sync=False, compression=opts.compression_type,
                         compression_level=opts.compression_level)

    def write(self, record) -> None:
        if isinstance(record, dict):
            raise TypeError("TFRecordWriter.write takes the bytes of one record, not a dict; build an "
                            "fl.train.Example from the dict and write example.SerializeToString()")
        if hasattr(record, "SerializeToString") and not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"TFRecordWriter.write takes bytes, not a {type(record).__name__} message; "
                            f"write record.SerializeToString()")
        if hasattr(record, "numpy") and not isinstance(record, (bytes, bytearray, memoryview)):
            record = record.numpy()
        super().write(record)

    def flush(self, sync=None):
        super().flush(sync)


class TFRecordDataset(RecordDataset):
    """The records of one or more TFRecord files, as ``bytes`` (``fl.data.TFRecordDataset``).

    ``filenames``: one path, a list of paths, or a dataset of paths (``Dataset.list_files``).
    ``compression_type``: None/"" (plain), "GZIP" or "ZLIB", for every file. ``buffer_size``: the
    read buffer per file in bytes (None: 256 KiB). ``num_parallel_reads``: None reads the files one
    after another; a count ``n`` (or ``fl.data.AUTOTUNE``) reads ``n`` files at once, each in its own
    thread, and mixes their records one at a time in a fixed order (an ``interleave`` with
    ``cycle_length=n``, ``block_length=1``).

    Every record's length and data are checked against their CRC-32C: corruption or truncation raises
    ``fl.errors.DataLossError`` naming the file, the record's index and its byte offset
    (``ignore_errors=True`` skips bad records instead, as ``RecordDataset`` does). Elements are
    Python ``bytes``, flowlab's string scalars: parse them with ``.map(lambda r:
    fl.io.parse_single_example(r, features))``.
    """

    _framing = TFRECORD_FRAMING

    def __init__(self, filenames, compression_type=None, buffer_size=None, num_parallel_reads=None,
                 ignore_errors: bool = False):
        super().__init__(filenames, ignore_errors=ignore_errors, decode=False)
        self._compression = compression_name(compression_type)
        if buffer_size is not None and (not isinstance(buffer_size, int) or buffer_size < 0):
            raise ValueError(f"TFRecordDataset: buffer_size must be a byte count >= 0 (or None), got {buffer_size!r}")
        self._buffer_size = buffer_size
        if num_parallel_reads is not None:
            resolve_parallelism(num_parallel_reads, Options())    # a bad value fails here, not when iterated
        self._num_parallel_reads = num_parallel_reads

    def _one_file(self, name):
        return TFRecordDataset(name, self._compression, self._buffer_size, None, self._ignore_errors)

    def _make_iterator(self):
        reads = self._num_parallel_reads
        if reads is None or reads == 1:
            return _iter_records(self._filenames, self._ignore_errors, False, self._stats,
                                 TFRecordReader, self._compression, self._buffer_size)
        from ._run import iterate
        from .dataset import _FunctionDataset
        names = self._filenames
        source = names if isinstance(names, Dataset) else _FunctionDataset(lambda: iter(names), str, "filenames")
        cycle = AUTOTUNE if reads == AUTOTUNE else int(reads)
        parent = self

        def one_file(name):
            dataset = parent._one_file(name)
            dataset._stats = parent._stats               # skips count on the dataset the user holds
            return dataset
        return iterate(source.interleave(one_file, cycle_length=cycle, num_parallel_calls=cycle))

    def __repr__(self):
        names = self._filenames if isinstance(self._filenames, (list, tuple)) else "..."
        extra = f" {self._compression}" if self._compression else ""
        return f"<TFRecordDataset {names!r}{extra}>"


def tf_record_iterator(path, options=None):
    """The records (``bytes``) of the TFRecord file ``path``, one at a time, checking every CRC
    (TensorFlow 1's ``tf.compat.v1.io.tf_record_iterator``)."""
    return TFRecordReader(os.fspath(path), compression=_options(options).compression_type)
