"""The wire format: a signed header plus raw buffers, and the checks a receiver makes.

A message is a list of frames::

    [signature + header, buffer 0, buffer 1, ...]

- ``header`` is what :class:`Signer` writes, the *compact* header: a fixed part packed with
  ``struct`` (``<BQdHI``: the tag byte COMPACT = 2, ``seq``, ``t`` (UNIX time, float), the byte
  lengths of the next two parts), then three UTF-8 JSON texts back to back: the *route*
  ``[SENDER, RECEIVER, TYPE]``, the buffer descriptions ``[...]`` and the body ``{...}`` (the
  message's own fields, to the end of the header). It is the only header: a first byte other
  than COMPACT is refused as malformed.
- ``signature`` (the first 32 bytes of the first frame) is HMAC-SHA256 of the header bytes with
  the cluster's key (at least 16 random bytes), compared in constant time, as Jupyter signs its
  messages. Signature and header share one frame: one frame fewer to send and receive per message.
  Nothing in the header is parsed before its signature checks out.
- A tensor travels as one raw frame, never pickled or copied: its dtype and shape are in ``bufs``
  (``["nd", "<f4", [64, 64]]``), so the frame length is checked before numpy looks at it. Raw
  bytes are ``["b", n]``. A pickle (code to run, a result) is ``["p", n, sha256]``: the digest is
  part of the signed header, so a pickle is unpickled only after both checks pass, and only by the
  handler that asked for it (:func:`loads`).

A receiver (:class:`Verifier`) drops a message, raising :class:`ProtocolError`, when the frames are
missing or malformed, the signature is absent or wrong, the header is not addressed to it, it is
older than the time window, or its ``(from, seq)`` pair was seen before (a replay). Each sender
numbers its messages 1, 2, 3...; the receiver keeps, per sender, the highest number seen and the
numbers seen in a window just below it, so messages reordered between a sender's threads still pass.

Speed (a tiny round trip is mostly this module's Python on both sides): the fixed fields need no
parsing, and the route and buffer descriptions repeat from message to message, so a receiver
parses each distinct one with json once, checks it and keeps it (with a decoding plan for the
buffers: dtype, shape, byte count); a sender keeps its routes. A plain reply's body
``{"re": N, "ok": true}`` is written and read without json. Anything unusual takes the full parse,
which says what is wrong.

Raw tensor frames are covered by their length in the signed header, not by the signature itself
(hashing a 64 MiB tensor would halve the transfer rate); ``pack(..., sign_buffers=True)`` adds a
digest for each buffer where that matters.

Memory before verification: no frame may be longer than :data:`MAX_FRAME` bytes
(``FLOWLAB_MAX_FRAME_MB``, default 4096 MiB), and a transport that can look at the first frame
before it receives the rest asks :meth:`Verifier.admit` first: the signature, the address, the
time and the replay window are checked and the buffer sizes must be exactly those the signed
header lists, so nothing a peer announces is allocated before the header is known to be genuine
(the local lane does this, see :mod:`.unix`; so does TCP for a message with a frame larger than
one ZeroMQ part, which it joins from its parts, see :mod:`.transport`).
"""
from __future__ import annotations

import hashlib
import hmac
import io
import itertools
import json
import os
import pickle
import struct
import sys
import time

from .errors import ProtocolError

__all__ = ["COMPACT", "KEY_BYTES", "new_key", "Message", "Pickled", "Signer", "Verifier", "ReplayGuard",
           "dumps", "loads", "new_id"]

COMPACT = 2               # the first byte of a header (the compact layout's tag: 1 was an older JSON one)
KEY_BYTES = 32            # the key new_key() makes; a key must have at least 16 bytes
TIME_WINDOW = 300.0       # seconds: a header older (or newer) than this is dropped
REPLAY_WINDOW = 4096      # how far below a sender's highest seq a late message may still arrive
_ALLOWED_KINDS = frozenset("biufc")   # dtype kinds a tensor frame may have (no objects, no void)


def _max_frame_from_env() -> int:
    text = os.environ.get("FLOWLAB_MAX_FRAME_MB", "4096")
    try:
        mib = float(text)
        if not mib > 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"FLOWLAB_MAX_FRAME_MB={text!r} is not a positive number of mebibytes (the largest "
                         f"frame, e.g. one tensor, a peer may send; unset it for the default, 4096)") from None
    return int(mib * (1 << 20))


MAX_FRAME = _max_frame_from_env()     # bytes: a longer frame (tensor, pickle) is refused on every lane

_COMPACT = struct.Struct("<BQdHI")   # tag, seq, time, route length, bufs length
_COMPACT_SIZE = _COMPACT.size
_compact = _COMPACT.pack
_uncompact = _COMPACT.unpack_from
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


def _frames(buffers, sign):
    """The frames of ``buffers`` and the header's JSON list describing them."""
    if not buffers:
        return (), b"[]"
    frames, descs = [], []
    for b in buffers:
        frame, desc, _ = _describe(b, sign)
        frames.append(frame)
        descs.append(desc)
    return frames, f"[{', '.join(descs)}]".encode()


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
        self._routes: dict[tuple, bytes] = {}    # (to, type) -> the header's route, ["from", "to", "type"]

    def next_seq(self) -> int:
        """Take the next sequence number (to know a message's seq before packing it)."""
        return next(self._seq)

    def pack(self, type: str, to: str, body=None, buffers=(), sign_buffers: bool = False, seq=None) -> list:
        """The frames of one message to ``to`` (a receiver's id); ``seq`` from :meth:`next_seq`,
        or the next one."""
        frames, bufs = _frames(buffers, sign_buffers)
        return self._signed(type, to, next(self._seq) if seq is None else seq, bufs,
                            _body_json(body).encode() if body else b"{}", frames)

    def _signed(self, type, to, seq, bufs, body: bytes, frames) -> list:
        """The signed compact header (seq, time, route, buffer list, body) and the buffer frames."""
        route = self._routes.get((to, type))
        if route is None:
            route = self._route(to, type)
        header = _compact(COMPACT, seq, _now(), len(route), len(bufs)) + route + bufs + body
        return [self._mac(header) + header, *frames]

    def _route(self, to, type) -> bytes:
        route = _dumps_json([self.sender, to, type]).encode()
        if len(route) > 65535:
            raise ValueError(f"a receiver id and message type of {len(route)} bytes is too long")
        if len(self._routes) >= 1024:
            self._routes.clear()
        self._routes[to, type] = route
        return route

    def reply(self, to: str, re: int, body=None, buffers=()) -> list:
        """The frames of a successful ``reply`` to request ``re`` from ``to``: as ``pack("reply",
        to, {**body, "re": re, "ok": True}, buffers)``, with the body's fixed fields written
        directly (no dict merge; the common reply is nothing but them)."""
        if body and body.__class__ is not dict and not isinstance(body, dict):
            raise TypeError(f"a reply's body must be a dict, not {type(body).__name__}")
        if body and ("re" in body or "ok" in body):
            return self.pack("reply", to, {**body, "re": re, "ok": True}, buffers)
        frames, bufs = _frames(buffers, False)
        rest = f', {_body_json(body)[1:]}' if body else "}"
        return self._signed("reply", to, next(self._seq), bufs, f'{{"re": {int(re)}, "ok": true{rest}'.encode(), frames)


class ReplayGuard:
    """Per sender: the highest ``seq`` seen and the set of numbers seen in the REPLAY_WINDOW below
    it (a set, not a bitmask: an in-order message costs one insertion, not shifts of a 4096-bit
    integer; numbers that fell out of the window are swept out now and then)."""

    def __init__(self, window: int = REPLAY_WINDOW, max_senders: int = 4096):
        self.window, self.max_senders = window, max_senders
        self._seen: dict[str, list] = {}   # sender -> [highest, numbers seen in the window, last time]

    def check(self, sender: str, seq: int, t: float) -> None:
        """Record ``(sender, seq)``; raise ProtocolError if it was seen or is too old to tell."""
        state = self._seen.get(sender)
        if state is None:
            if len(self._seen) >= self.max_senders:
                self._evict(t)
            self._seen[sender] = [seq, {seq}, t]
            return
        high, seen = state[0], state[1]
        if seq > high:
            state[0] = high = seq
        else:
            back = high - seq
            if back >= self.window:
                raise ProtocolError(f"replayed or too late: seq {seq} from {sender} is {back} below its latest")
            if seq in seen:
                raise ProtocolError(f"replayed message: seq {seq} from {sender} was seen before")
        seen.add(seq)
        if len(seen) > 2 * self.window:
            low = high - self.window
            state[1] = {n for n in seen if n > low}
        state[2] = t

    def seen(self, sender: str, seq: int) -> bool:
        """Whether :meth:`check` would refuse ``(sender, seq)`` now (it records nothing)."""
        state = self._seen.get(sender)
        if state is None or seq > state[0]:
            return False
        return state[0] - seq >= self.window or seq in state[1]

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
        self._routes: dict = {}   # a header's route text -> (type, from, to)
        self._bufs: dict = {}     # a header's "bufs" text -> (descriptions, decoding plan)

    def _signed_header(self, first) -> bytes:
        """The header of a first frame (``signature + header``) whose signature checks out under
        this cluster's key; ProtocolError otherwise."""
        if first.__class__ is not bytes:
            first = bytes(first)
        if len(first) < 34:
            raise ProtocolError("unsigned or malformed message (no 32-byte signature and header)")
        header = first[32:]
        if not _compare(first[:32], self._mac(header)):
            raise ProtocolError("bad signature: the message was not signed with this cluster's key")
        return header

    def unpack(self, frames) -> Message:
        """The checked Message in ``frames`` (``[signature + header, *buffers]``, each bytes-like);
        raises ProtocolError, saying why, for anything that fails a check."""
        if not frames:
            raise ProtocolError("malformed message: no frames")
        header = self._signed_header(frames[0])
        msg = self._fast(header, frames)
        if msg is not None:
            return msg
        try:
            if header[0] != COMPACT:
                raise ValueError(f"header tag {header[0]}, not {COMPACT} (the compact header)")
            _, seq, t, lr, lb = _uncompact(header)
            o = _COMPACT_SIZE + lr
            route, descs, body = json.loads(header[_COMPACT_SIZE:o]), json.loads(header[o:o + lb]), \
                json.loads(header[o + lb:])
            if route.__class__ is not list or len(route) != 3 or not all(r.__class__ is str for r in route):
                raise ValueError("the route is not [from, to, type]")
            sender, to, type_ = route
            if descs.__class__ is not list:
                raise ValueError("bufs is not a list")
            if body.__class__ is not dict:
                raise ValueError("the body is not an object")
        except (ValueError, KeyError, TypeError, StopIteration, struct.error) as e:
            raise ProtocolError(f"malformed header ({e.__class__.__name__}: {e})") from None
        if to not in self.me and not (to == "*" and type_ in self.anyone):
            raise ProtocolError(f"message addressed to {to!r}, not to this receiver")
        if seq.__class__ is not int or seq < 1 or t.__class__ is not float:
            raise ProtocolError("malformed header: bad seq or time")
        age = _now() - t
        if not (age <= self.window and -age <= self.window):    # NaN (json reads it) fails too
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

    def admit(self, first, sizes) -> None:
        """Check a message's first frame (signature + header) before its buffers are received:
        raises ProtocolError unless it is signed with this cluster's key, addressed here, within
        the time window, not a replay, and ``sizes`` (the byte lengths of the frames that follow)
        are exactly those its header lists, none over MAX_FRAME. Records nothing: :meth:`unpack`
        still checks the whole message."""
        header = self._signed_header(first)
        try:
            if header[0] != COMPACT:
                raise ValueError(f"header tag {header[0]}, not {COMPACT} (the compact header)")
            _, seq, t, lr, lb = _uncompact(header)
            o = _COMPACT_SIZE + lr
            head = self._routes.get(header[_COMPACT_SIZE:o]) or self._learn_route(header[_COMPACT_SIZE:o])
            if head is None:
                raise ValueError("the route is not [from, to, type]")
            type_, sender, to = head
            bufs = self._bufs.get(header[o:o + lb]) or self._learn_bufs(header[o:o + lb])
            if bufs is None:
                raise ValueError("bad buffer list")
            descs = bufs[0]
            expected = [_desc_nbytes(d) for d in descs]
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
            raise ProtocolError(f"malformed header ({e.__class__.__name__}: {e})") from None
        if to not in self.me and not (to == "*" and type_ in self.anyone):
            raise ProtocolError(f"message addressed to {to!r}, not to this receiver")
        if seq.__class__ is not int or t.__class__ is not float:
            raise ProtocolError("malformed header: bad seq or time")
        age = _now() - t
        if not (age <= self.window and -age <= self.window):
            raise ProtocolError(f"stale message: sent {age:.0f} s ago (window {self.window:.0f} s)")
        if self.guard.seen(sender, seq):
            raise ProtocolError(f"replayed message: seq {seq} from {sender} was seen before")
        if list(sizes) != expected:
            raise ProtocolError(f"frames of {list(sizes)} bytes, the signed header lists {expected}")
        if expected and max(expected) > MAX_FRAME:
            raise ProtocolError(f"a frame of {max(expected)} bytes is over the limit of {MAX_FRAME} "
                                f"(FLOWLAB_MAX_FRAME_MB on the receiving side raises it)")

    def _fast(self, header: bytes, frames):
        """The checked Message of a signed ``header`` read with what earlier messages taught (see
        the module's docstring); None (the caller parses it in full) for anything else, and for
        anything that fails a check (the full parse then says why). The header is cut by its
        packed lengths; the route and BUFS are learned once each (parsed with json, checked,
        kept); BODY is parsed as one JSON value."""
        if header[0] != COMPACT:
            return None
        try:
            _, seq, t, lr, lb = _uncompact(header)
        except struct.error:
            return None
        o = _COMPACT_SIZE + lr
        e = o + lb
        head = self._routes.get(header[_COMPACT_SIZE:o])
        if head is None:
            head = self._learn_route(header[_COMPACT_SIZE:o])
            if head is None:
                return None
        bufs_b, body_b = header[o:e], header[e:]
        bufs = self._bufs.get(bufs_b)
        if bufs is None:
            bufs = self._learn_bufs(bufs_b)
            if bufs is None:
                return None
        if body_b == b"{}":
            body = {}
        elif body_b[-13:] == b', "ok": true}' and body_b[:7] == b'{"re": ' and body_b[7:-13].isdigit():
            body = {"re": int(body_b[7:-13]), "ok": True}      # a plain reply, as Signer.reply writes it
        else:
            try:
                text = body_b.decode()
                body, end = _scan(text, 0)
            except (ValueError, StopIteration):
                return None
            if end != len(text) or body.__class__ is not dict:
                return None
        type_, sender, to = head
        if to not in self.me and not (to == "*" and type_ in self.anyone):
            return None
        age = _now() - t
        if seq < 1 or not (age <= self.window and -age <= self.window):
            return None
        plan = bufs[1]
        if len(frames) != len(bufs[0]) + 1:
            return None
        if not plan:
            buffers, nbytes = [], 0
        elif plan.__class__ is tuple:
            buffers, nbytes = [], 0
            for (dtype, shape, n), frame in zip(plan, itertools.islice(frames, 1, None)):
                if frame.__class__ is bytes:              # what both lanes hand up for a small frame
                    if len(frame) != n:
                        return None
                else:
                    frame = frame if frame.__class__ is memoryview else memoryview(frame)
                    if frame.nbytes != n:
                        return None
                arr = _frombuffer(frame, dtype)
                buffers.append(arr if shape is None else arr.reshape(shape))
                nbytes += n
        else:
            buffers, nbytes = _decode_buffers(bufs[0], frames)
        self.guard.check(sender, seq, t)
        return Message(type_, body, buffers, sender, seq, nbytes)

    def _learn_route(self, route: bytes):
        try:
            r = json.loads(route)
        except ValueError:
            return None
        if r.__class__ is not list or len(r) != 3 or not all(x.__class__ is str for x in r):
            return None
        if len(self._routes) >= 256:
            self._routes.clear()
        head = self._routes[route] = (r[2], r[0], r[1])
        return head

    def _learn_bufs(self, text: bytes):
        """(descriptions, plan) for a header's ``bufs`` text: the plan is () for no buffers, a
        tuple of (dtype, shape or None for 1-d, nbytes) when every buffer is a plain tensor, else
        True (decode each description as it comes)."""
        try:
            descs = json.loads(text)
        except ValueError:
            return None
        if descs.__class__ is not list:
            return None
        plan = ()
        if descs:
            plan = []
            for d in descs:
                if not (d.__class__ is list and len(d) == 3 and d[0] == "nd" and d[1].__class__ is str
                        and d[2].__class__ is list):
                    plan = True
                    break
                try:
                    dtype = _dtype_in(d[1])
                except (TypeError, ValueError, ProtocolError):
                    return None
                count = 1
                for s in d[2]:
                    if s.__class__ is not int or s < 0:
                        return None
                    count *= s
                plan.append((dtype, None if len(d[2]) == 1 else tuple(d[2]), count * dtype.itemsize))
            if plan is not True:
                plan = tuple(plan)
        if len(self._bufs) >= 256:
            self._bufs.clear()
        out = self._bufs[text] = (descs, plan)
        return out


def _desc_nbytes(desc) -> int:
    """The byte length a buffer description announces (raises ValueError/TypeError/IndexError)."""
    kind = desc[0]
    if kind in ("b", "p"):
        n = desc[1]
    elif kind == "nd":
        n = _dtype_in(desc[1]).itemsize
        for s in desc[2]:
            if s.__class__ is not int or s < 0:
                raise ValueError(f"shape {desc[2]}")
            n *= s
    else:
        raise ValueError(f"unknown buffer kind {kind!r}")
    if n.__class__ is not int or n < 0:
        raise ValueError(f"buffer length {n!r}")
    return n


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


def _dtype_in(code):
    dtype = _DTYPE_IN.get(code)
    if dtype is None:
        import numpy as np
        dtype = np.dtype(code)
        if dtype.kind not in _ALLOWED_KINDS:
            raise ProtocolError(f"tensor buffer with dtype {dtype} is not allowed")
        if len(_DTYPE_IN) < 256:
            _DTYPE_IN[code] = dtype
    return dtype


def _array(desc, mv, n):
    dtype = _dtype_in(desc[1])
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
