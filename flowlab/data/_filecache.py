"""``cache(filename)``: the elements of one complete pass written to a file, read back from then on
(in later epochs, and in later programs, until the file is deleted).

The file is a record file (``records.py``), so every byte read back is checksummed: a damaged cache
raises ``DataLossError`` naming the file, the record and its byte offset; it never feeds bad data.
Record 0 is a JSON header describing the element structure; each later record is one element, its
components encoded as an example whose features are named "0", "1"... in structure order.

A pass writes to a temporary file beside ``filename`` and renames it into place only when the pass
completes, so a pass that stops early (``take``, an error, a dropped iterator) leaves no cache and
the file is never seen half-written. Two passes racing both complete; the last rename wins.
"""
from __future__ import annotations

import collections
import itertools
import json
import os

from ..core.errors import InvalidArgumentError
from ..core.tensor import Tensor
from .records import RecordReader, RecordWriter, decode_example, encode_example

__all__ = ["write_through", "read_cache"]

_FORMAT = "flowlab.data.cache"
_VERSION = 1
_ids = itertools.count()


def _describe(element, leaves: list):
    """A JSON-able description of the element's structure; its leaves are appended to ``leaves``."""
    if isinstance(element, tuple):
        items = [_describe(e, leaves) for e in element]
        if hasattr(element, "_fields"):
            return {"namedtuple": type(element).__name__, "fields": list(element._fields), "items": items}
        return {"tuple": items}
    if isinstance(element, dict):
        if not all(isinstance(k, str) for k in element):
            raise InvalidArgumentError(f"cache: a file cache needs str dict keys, got {list(element)}", op="cache")
        return {"dict": [[k, _describe(v, leaves)] for k, v in element.items()]}
    if not isinstance(element, (Tensor, bytes, str)):
        raise InvalidArgumentError(f"cache: cannot write a {type(element).__name__} component to a file", op="cache")
    leaves.append(element)
    return len(leaves) - 1


def _rebuild(description, leaves, classes):
    if isinstance(description, int):
        return leaves[description]
    if "tuple" in description:
        return tuple(_rebuild(d, leaves, classes) for d in description["tuple"])
    if "dict" in description:
        return {k: _rebuild(d, leaves, classes) for k, d in description["dict"]}
    key = (description["namedtuple"], tuple(description["fields"]))
    if key not in classes:
        classes[key] = collections.namedtuple(*key)
    return classes[key](*(_rebuild(d, leaves, classes) for d in description["items"]))


def write_through(source, path: str):
    """Yield ``source``'s elements while writing them; the cache exists once the pass completes."""
    tmp = f"{path}.partial-{os.getpid()}-{next(_ids)}"
    writer, structure, complete = None, None, False
    try:
        for index, element in enumerate(source):
            leaves: list = []
            description = _describe(element, leaves)
            if writer is None:
                writer = _open(tmp, path, description)
                structure = description
            elif description != structure:
                raise InvalidArgumentError(f"cache: element {index} has a different structure from element 0 "
                                           f"({description} vs {structure})", op="cache")
            writer.write(encode_example({str(i): leaf for i, leaf in enumerate(leaves)}))
            yield element
        if writer is None:                # an empty dataset caches as an empty file
            writer = _open(tmp, path, None)
        writer.close()
        os.replace(tmp, path)
        complete = True
    finally:
        if writer is not None:
            writer.close()
        if not complete:
            try:
                os.remove(tmp)
            except OSError:
                pass


def _open(tmp, path, structure) -> RecordWriter:
    try:
        writer = RecordWriter(tmp)
    except OSError as e:
        raise OSError(e.errno, f"cache: cannot write the cache file next to {path!r}: {e.strerror}", tmp) from e
    writer.write(json.dumps({"format": _FORMAT, "version": _VERSION, "structure": structure}).encode())
    return writer


def read_cache(path: str):
    """The elements of a complete cache file."""
    with RecordReader(path) as reader:
        header = next(reader, None)
        try:
            meta = json.loads(header) if header is not None else None
            ok = isinstance(meta, dict) and meta.get("format") == _FORMAT
        except ValueError:
            ok = False
        if not ok:
            raise InvalidArgumentError(f"cache: {path!r} exists but is not a flowlab cache file; delete it (or "
                                       f"choose another filename) to cache there", op="cache")
        if meta.get("version") != _VERSION:
            raise InvalidArgumentError(f"cache: {path!r} has cache version {meta.get('version')!r}; this flowlab "
                                       f"reads version {_VERSION}; delete the file to rebuild it", op="cache")
        structure, classes = meta["structure"], {}
        for payload in reader:
            example = decode_example(payload)
            leaves = [example[str(i)] for i in range(len(example))]
            leaves = [leaf if isinstance(leaf, (bytes, str)) else Tensor(leaf) for leaf in leaves]
            yield _rebuild(structure, leaves, classes)
