"""Compressed record streams: the file objects a record reader reads and a record writer writes.

A record file may be a plain stream of records, or the same stream compressed as a whole, as
TensorFlow writes TFRecord files: ``"GZIP"`` (a gzip file, RFC 1952) or ``"ZLIB"`` (a zlib stream,
RFC 1950, with a 32 KiB window). Offsets in error messages count bytes of the *uncompressed*
stream, because that is where the records are.
"""
from __future__ import annotations

import gzip
import io
import zlib

__all__ = ["COMPRESSIONS", "compression_name", "open_for_reading", "open_for_writing"]

COMPRESSIONS = ("", "GZIP", "ZLIB")
_DEFAULT_BUFFER = 256 * 1024


def compression_name(value, what="compression_type") -> str:
    """``None``, ``""``, ``"GZIP"`` or ``"ZLIB"`` (any case) as one of ``COMPRESSIONS``."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and value.upper() in COMPRESSIONS:
        return value.upper()
    raise ValueError(f"{what} must be None, '', 'GZIP' or 'ZLIB', got {value!r}")


class _ZlibReader(io.RawIOBase):
    """The decompressed bytes of a zlib stream, read on demand."""

    def __init__(self, raw, chunk):
        self._raw, self._chunk = raw, chunk
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS)
        self._pending, self._pos = b"", 0

    def readable(self):
        return True

    def readinto(self, buffer):
        while self._pos >= len(self._pending):
            if self._inflate.eof:
                return 0
            data = self._raw.read(self._chunk)
            if not data:
                raise EOFError("the zlib stream ends early (the file is truncated)")
            self._pending, self._pos = self._inflate.decompress(data), 0
        n = min(len(buffer), len(self._pending) - self._pos)
        buffer[:n] = memoryview(self._pending)[self._pos:self._pos + n]
        self._pos += n
        return n

    def close(self):
        if not self.closed:
            self._raw.close()
        super().close()


class _ZlibWriter(io.RawIOBase):
    """Compresses what is written into a zlib stream; ``close`` finishes the stream."""

    def __init__(self, raw, level):
        self._raw = raw
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS)
        self._finished = False

    def writable(self):
        return True

    def write(self, data):
        data = memoryview(data)
        self._raw.write(self._deflate.compress(data))
        return data.nbytes

    def flush(self):
        if not self.closed and not self._finished:
            self._raw.write(self._deflate.flush(zlib.Z_SYNC_FLUSH))   # everything so far is readable
            self._raw.flush()

    def fileno(self):
        return self._raw.fileno()

    def close(self):
        if not self.closed:
            try:
                self._raw.write(self._deflate.flush(zlib.Z_FINISH))
            finally:
                self._finished = True
                self._raw.close()
        super().close()


def open_for_reading(path, compression: str = "", buffer_size=None):
    """A binary file object giving the uncompressed stream of ``path``."""
    size = _DEFAULT_BUFFER if buffer_size is None or int(buffer_size) <= 0 else int(buffer_size)
    raw = open(path, "rb", buffering=size)
    if compression == "GZIP":
        return _OwningGzip(raw)
    if compression == "ZLIB":
        return io.BufferedReader(_ZlibReader(raw, size), size)
    return raw


class _OwningGzip(gzip.GzipFile):
    """A GzipFile that closes the file it reads or writes (``fileobj=`` ones do not)."""

    def __init__(self, raw, mode="rb", level=9):
        super().__init__(fileobj=raw, mode=mode, compresslevel=level, mtime=0)
        self._owned = raw

    def fileno(self):
        return self._owned.fileno()

    def close(self):
        try:
            super().close()
        finally:
            self._owned.close()


def open_for_writing(path, compression: str = "", level=None):
    """A new binary file at ``path`` (replacing one) that compresses what is written to it."""
    raw = open(path, "wb")
    if compression == "GZIP":
        return _OwningGzip(raw, "wb", 6 if level is None else int(level))
    if compression == "ZLIB":
        return _ZlibWriter(raw, zlib.Z_DEFAULT_COMPRESSION if level is None else int(level))
    return raw
