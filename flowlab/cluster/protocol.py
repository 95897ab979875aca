"""The wire format: a signed JSON header plus raw buffers, and the checks a receiver makes.

A message is a list of frames::

    [signature + header, buffer 0, buffer 1, ...]

- ``header`` is UTF-8 JSON: ``{"v": 1, "type": "run", "from": SENDER, "to": RECEIVER, "seq": N,
  "t": UNIX_TIME, "bufs": [...], "body": {...}}``. ``body`` holds the message's own fields.
- ``signature`` (the first 32 bytes of the first frame) is HMAC-SHA256 of the header bytes with
  the cluster's key (at least 16 random bytes), compared in constant time, as Jupyter signs its
  messages. Signature and header share one frame: one frame fewer to send and receive per message.
- A tensor travels as one raw frame, never pickled or copied: its dtype and shape are in ``bufs``
  (``["nd", "<f4", [64, 64]]``), so the frame length is checked before numpy looks at it. Raw
  bytes are ``["b", n]``. A pickle (code to run, a result) is ``["p", n, sha256]``: the digest is
  part of the signed header, so a pickle is unpickled only after both checks pass, and only by the
  handler that asked for it (:func:`loads`).

A receiver (:class:`Verifier`) drops a message, raising :class:`ProtocolError`, when the frames are
missing or malformed, the signature is absent or wrong, the header is not addressed to it, it is
older than the time window, or its ``(from, seq)`` pair was seen before (a replay). Each sender
numbers its messages 1, 2, 3...; the receiver keeps, per sender, the highest number seen and a
window of the ones just below it, so messages reordered between a sender's threads still pass.

Raw tensor frames are covered by their length in the signed header, not by the signature itself
(hashing a 64 MiB tensor would halve the transfer rate); ``pack(..., sign_buffers=True)`` adds a
digest for each buffer where that matters.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import itertools
import json
import os
import pickle
import sys
import time

from .errors import ProtocolError

__all__ = ["VERSION", "KEY_BYTES", "new_key", "Message", "Pickled", "Signer", "Verifier", "ReplayGuard",
           "dumps", "loads", "new_id"]

VERSION = 1
KEY_BYTES = 32            # the key new_key() makes; a key must have at least 16 bytes
TIME_WINDOW = 300.0       # seconds: a header older (or newer) than this is dropped
REPLAY_WINDOW = 4096      # how far below a sender's highest seq a late message may still arrive
_ALLOWED_KINDS = frozenset("biufc")   # dtype kinds a tensor frame may have (no objects, no void)

_compare = hmac.compare_digest
_dumps_json = json.dumps
_scan = json.JSONDecoder().scan_once   # one JSON value from a str, no encoding sniffing
_now = time.time


def new_key() -> bytes:
    """A fresh random cluster key (256 bits)."""
    return os.urandom(KEY_BYTES)


def new_id(prefix: str) -> str:
    """A random identifier for a sender or a server's incarnation, e.g. ``client-3f9a01c2e4d5b6a7``."""
    return f"{prefix}-{os.urandom(8).hex()}"


def _check_key(key) -> bytes:
    if isinstance(key, str):
        key = bytes.fromhex(key)
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise ValueError("a cluster key must be at least 16 random bytes (128 bits); use "
                         "flowlab.cluster.protocol.new_key()")
    return bytes(key)


class Pickled(bytes):
    """Bytes that are a pickle: sent with a SHA-256 digest in the signed header, unpickled with
    :func:`loads` only by a handler that expects one."""
    __slots__ = ()


class Message:
    """A checked message: ``type``, ``body`` (dict), ``buffers`` (numpy arrays for tensors,
    memoryviews for raw bytes, :class:`Pickled` for pickles), ``sender`` and ``seq``."""
    __slots__ = ("type", "body", "buffers", "sender", "seq", "nbytes")

    def __init__(self, type, body, buffers, sender, seq, nbytes=0):
        self.type, self.body, self.buffers, self.sender, self.seq, self.nbytes = type, body, buffers, sender, seq, nbytes

    def __repr__(self):
        return f"<Message {self.type} from={self.sender} seq={self.seq} body={self.body!r} buffers={len(self.buffers)}>"


_ND_DESC: dict = {}       # (dtype, shape) -> the descriptor of a C-contiguous array of that kind
_ndarray = None          # numpy.ndarray, once an array has been sent


def _describe(buf, sign):
    """(frame, descriptor as JSON text, nbytes) for one outgoing buffer."""
    if buf.__class__ is _ndarray and not sign and buf.flags.c_contiguous:   # the common case, quickly
        desc = _ND_DESC.get((buf.dtype, buf.shape))
        if desc is not None:
            return buf, desc, buf.nbytes
    return _describe_any(buf, sign)


def _describe_any(buf, sign):
    global _ndarray
    if isinstance(buf, Pickled):
        return buf, f'["p", {len(buf)}, "{hashlib.sha256(buf).hexdigest()}"]', len(buf)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(buf, np.generic):   # a numpy scalar: a 0-d tensor
        buf = np.asarray(buf)
    if np is not None and isinstance(buf, np.ndarray):
        dtype = buf.dtype
        code = _DTYPE_OUT.get(dtype)
        if code is None:
            if dtype.kind not in _ALLOWED_KINDS:
                raise TypeError(f"cannot send an array of dtype {dtype} as a raw buffer")
            code = _DTYPE_OUT[dtype] = dtype.str
        if not buf.flags.c_contiguous:
            buf = np.ascontiguousarray(buf)
        shape = buf.shape
        dims = str(shape[0]) if len(shape) == 1 else ", ".join(map(str, shape))
        if sign:
            return buf, f'["nd", "{code}", [{dims}], "{hashlib.sha256(buf).hexdigest()}"]', buf.nbytes
        desc = f'["nd", "{code}", [{dims}]]'
        if buf.__class__ is np.ndarray and len(_ND_DESC) < 1024:
            _ND_DESC[dtype, shape] = desc
            _ndarray = np.ndarray
        return buf, desc, buf.nbytes
    n = memoryview(buf).nbytes
    digest = f', "{hashlib.sha256(buf).hexdigest()}"' if sign else ""
    return buf, f'["b", {n}{digest}]', n


def _mac_factory(key):
    """A function ``mac(data) -> 32-byte HMAC-SHA256``: a keyed state is made once and copied per
    message (OpenSSL's HMAC object when available: about twice as fast as ``hmac.digest``)."""
    try:
        import _hashlib
        base = _hashlib.hmac_new(key, digestmod="sha256")
    except (ImportError, AttributeError, ValueError, TypeError):
        base = hmac.new(key, digestmod=hashlib.sha256)

    def mac(data, _copy=base.copy):
        m = _copy()
        m.update(data)
        return m.digest()
    return mac


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:*#")


def _json_str(text: str) -> str:
    """``text`` as a JSON string literal; ids and types are plain words, written without json."""
    return f'"{text}"' if _SAFE.issuperset(text) else _dumps_json(text)


def _body_json(body) -> str:
    """``body`` as JSON: a flat dict of word keys and ints, bools or words (a reply's ``re`` and
    ``ok``, an op's fields) is written directly, anything else by json."""
    if body.__class__ is dict and len(body) <= 4:
        parts = []
        for k, v in body.items():
            c = v.__class__
            if c is bool:
                v = "true" if v else "false"
            elif c is int:
                v = str(v)
            elif c is str and len(v) < 64 and _SAFE.issuperset(v):
                v = f'"{v}"'
            else:
                return _dumps_json(body)
            if k.__class__ is not str or not _SAFE.issuperset(k):
                return _dumps_json(body)
            parts.append(f'"{k}": {v}')
        return "{" + ", ".join(parts) + "}"
    return _dumps_json(body)


class Signer:
    """Packs outgoing messages for one sender: numbers them and signs their headers. The header's
    fixed part for each receiver is written once; per message only seq, time, buffers and body."""

    def __init__(self, key, sender: str):
        self.key = _check_key(key)
        self.sender = sender
        self._seq = itertools.count(1)
        self._mac = _mac_factory(self.key)
        self._prefix: dict[str, str] = {}
        self._types: dict[str, str] = {}

    def next_seq(self) -> int:
        """Take the next sequence number (to know a message's seq before packing it)."""
        return next(self._seq)

    def pack(self, type: str, to: str, body=None, buffers=(), sign_buffers: bool = False, seq=None) -> list:
        """The frames of one message to ``to`` (a receiver's id); ``seq`` from :meth:`next_seq`,
        or the next one."""
        if buffers:
            frames, descs = [], []
            for b in buffers:
                frame, desc, _ = _describe(b, sign_buffers)
                frames.append(frame)
                descs.append(desc)
            bufs = f"[{', '.join(descs)}]"
        else:
            frames, bufs = (), "[]"
        if seq is None:
            seq = next(self._seq)
        prefix = self._prefix.get(to)
        if prefix is None:
            prefix = self._prefix[to] = (f'{{"v": {VERSION}, "from": {_json_str(self.sender)}, '
                                         f'"to": {_json_str(to)}, "type": ')
        t = self._types.get(type)
        if t is None:
            t = self._types[type] = _json_str(type)
        header = (f'{prefix}{t}, "seq": {seq}, "t": {_now()!r}, "bufs": {bufs}, '
                  f'"body": {_body_json(body) if body else "{}"}}}').encode()
        return [self._mac(header) + header, *frames]


class ReplayGuard:
    """Per sender: the highest ``seq`` seen and a bitmask of the REPLAY_WINDOW numbers below it."""

    def __init__(self, window: int = REPLAY_WINDOW, max_senders: int = 4096):
        self.window, self.max_senders = window, max_senders
        self._full = (1 << window) - 1
        self._seen: dict[str, list] = {}   # sender -> [highest, mask, last time]

    def check(self, sender: str, seq: int, t: float) -> None:
        """Record ``(sender, seq)``; raise ProtocolError if it was seen or is too old to tell."""
        state = self._seen.get(sender)
        if state is None:
            if len(self._seen) >= self.max_senders:
                self._evict(t)
            self._seen[sender] = [seq, 1, t]
            return
        high, mask = state[0], state[1]
        if seq > high:
            shift = seq - high
            state[0], state[1] = seq, ((mask << shift) | 1) & self._full if shift < self.window else 1
        else:
            back = high - seq
            if back >= self.window:
                raise ProtocolError(f"replayed or too late: seq {seq} from {sender} is {back} below its latest")
            bit = 1 << back
            if mask & bit:
                raise ProtocolError(f"replayed message: seq {seq} from {sender} was seen before")
            state[1] = mask | bit
        state[2] = t

    def _evict(self, now):
        """Forget senders silent for longer than the time window (their old messages fail the
        time check anyway); if none is that old, the stalest one."""
        stale = [s for s, st in self._seen.items() if now - st[2] > TIME_WINDOW]
        for s in stale or [min(self._seen, key=lambda s: self._seen[s][2])]:
            del self._seen[s]


class Verifier:
    """Checks incoming frames for one receiver. ``me``: the ids a message may be addressed to
    (the receiver's own id; ``"*"`` is accepted only for the message types in ``anyone``)."""

    def __init__(self, key, me, anyone=("hello",), window: float = TIME_WINDOW):
        self.key = _check_key(key)
        self.me = {me} if isinstance(me, str) else set(me)
        self.anyone = frozenset(anyone)
        self.window = window
        self.guard = ReplayGuard()
        self._mac = _mac_factory(self.key)

    def unpack(self, frames) -> Message:
        """The checked Message in ``frames`` (``[signature + header, *buffers]``, each bytes-like);
        raises ProtocolError, saying why, for anything that fails a check."""
        if not frames:
            raise ProtocolError("malformed message: no frames")
        first = frames[0]
        if first.__class__ is not bytes:
            first = bytes(first)
        if len(first) < 34:
            raise ProtocolError("unsigned or malformed message (no 32-byte signature and header)")
        header = first[32:]
        if not _compare(first[:32], self._mac(header)):
            raise ProtocolError("bad signature: the message was not signed with this cluster's key")
        try:
            text = header.decode()
            h, end = _scan(text, 0)
            if end != len(text) or h["v"] != VERSION:
                raise ValueError("trailing data or wrong protocol version")
            type_, sender, to, seq, t, descs, body = (h["type"], h["from"], h["to"], h["seq"], h["t"],
                                                      h["bufs"], h["body"])
        except (ValueError, KeyError, TypeError, StopIteration) as e:
            raise ProtocolError(f"malformed header ({e.__class__.__name__}: {e})") from None
        if to not in self.me and not (to == "*" and type_ in self.anyone):
            raise ProtocolError(f"message addressed to {to!r}, not to this receiver")
        if seq.__class__ is not int or seq < 1 or t.__class__ is not float:
            raise ProtocolError("malformed header: bad seq or time")
        age = _now() - t
        if age > self.window or -age > self.window:
            raise ProtocolError(f"stale message: sent {age:.0f} s ago (window {self.window:.0f} s)")
        if descs:
            if len(descs) != len(frames) - 1:
                raise ProtocolError(f"header lists {len(descs)} buffer(s) but {len(frames) - 1} arrived")
            buffers, nbytes = _decode_buffers(descs, frames)
        elif len(frames) != 1:
            raise ProtocolError(f"header lists no buffers but {len(frames) - 1} arrived")
        else:
            buffers, nbytes = [], 0
        self.guard.check(sender, seq, t)   # last: a message that failed above does not burn its seq
        return Message(type_, body, buffers, sender, seq, nbytes)


def _decode_buffers(descs, frames):
    out, total = [], 0
    for desc, frame in zip(descs, frames[1:]):
        mv = frame if isinstance(frame, memoryview) else memoryview(frame)
        n = mv.nbytes
        total += n
        try:
            kind = desc[0]
            if kind == "nd":
                out.append(_array(desc, mv, n))
            elif kind in ("b", "p"):
                if desc[1] != n:
                    raise ProtocolError(f"buffer of {n} bytes, header says {desc[1]}")
                if kind == "p" or len(desc) > 2:
                    if hashlib.sha256(mv).hexdigest() != desc[2]:
                        raise ProtocolError("buffer does not match the digest in its signed header")
                out.append(Pickled(mv) if kind == "p" else mv)
            else:
                raise ProtocolError(f"unknown buffer kind {kind!r}")
        except (IndexError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed buffer description {desc!r} ({e})") from None
    return out, total


_DTYPE_OUT: dict = {}    # numpy dtype -> its wire code ("<f4"), filled as dtypes are sent
_DTYPE_IN: dict = {}     # wire code -> numpy dtype, filled as codes arrive


def _array(desc, mv, n):
    code = desc[1]
    dtype = _DTYPE_IN.get(code)
    if dtype is None:
        import numpy as np
        dtype = np.dtype(code)
        if dtype.kind not in _ALLOWED_KINDS:
            raise ProtocolError(f"tensor buffer with dtype {dtype} is not allowed")
        if len(_DTYPE_IN) < 256:
            _DTYPE_IN[code] = dtype
    shape = desc[2]
    count = 1
    for s in shape:
        if s.__class__ is not int or s < 0:
            raise ProtocolError(f"tensor buffer with shape {shape} is not allowed")
        count *= s
    if count * dtype.itemsize != n:
        raise ProtocolError(f"tensor buffer of {n} bytes does not hold {dtype}{list(shape)}")
    if len(desc) > 3 and hashlib.sha256(mv).hexdigest() != desc[3]:
        raise ProtocolError("tensor buffer does not match the digest in its signed header")
    arr = _frombuffer(mv, dtype)
    return arr if len(shape) == 1 else arr.reshape(shape)


def _frombuffer(mv, dtype):
    global _frombuffer
    import numpy as np
    _frombuffer = np.frombuffer    # numpy is loaded on the first tensor, not at import
    return np.frombuffer(mv, dtype)


# -- pickles: code and results, by value where they cannot be imported -------------------------
def dumps(obj) -> Pickled:
    """Pickle ``obj`` for a signed message. Functions, lambdas and closures defined in a notebook
    (or any module a worker cannot import) travel by value: see :mod:`flowlab.cluster._code`."""
    from ._code import Pickler

    f = io.BytesIO()
    Pickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return Pickled(f.getvalue())


def loads(data: Pickled):
    """Unpickle a :class:`Pickled` buffer of a message that passed :meth:`Verifier.unpack`."""
    if not isinstance(data, Pickled):
        raise ProtocolError("refusing to unpickle a buffer that did not arrive as a signed pickle")
    return pickle.loads(data)
