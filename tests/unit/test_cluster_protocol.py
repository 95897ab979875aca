"""The wire format: signing, replay protection, buffers, and code pickled by value."""
import json
import pickle

import numpy as np
import pytest

from flowlab.cluster import protocol as P
from flowlab.cluster.errors import ProtocolError

KEY = bytes(range(32))
ME, YOU = "server-aa", "client-bb"


def _pair(key=KEY):
    return P.Signer(key, YOU), P.Verifier(key, ME)


def test_round_trip_of_body_and_buffers():
    s, v = _pair()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([True, False])
    frames = s.pack("put", ME, {"key": "x", "n": [1, 2]}, [a, b, b"raw", P.dumps({"k": 1})])
    m = v.unpack(frames)
    assert (m.type, m.body, m.sender, m.seq) == ("put", {"key": "x", "n": [1, 2]}, YOU, 1)
    np.testing.assert_array_equal(m.buffers[0], a)
    assert m.buffers[0].dtype == np.float32 and m.buffers[0].shape == (3, 4)
    np.testing.assert_array_equal(m.buffers[1], b)
    assert bytes(m.buffers[2]) == b"raw"
    assert isinstance(m.buffers[3], P.Pickled) and P.loads(m.buffers[3]) == {"k": 1}
    assert m.nbytes == a.nbytes + b.nbytes + 3 + len(m.buffers[3])


def _fields(header: bytes) -> dict:
    """A compact header read by hand: tag, seq and time packed, then route, bufs and body as JSON."""
    import struct
    tag, seq, t, lr, lb = struct.unpack_from("<BQdHI", header)
    o = struct.calcsize("<BQdHI")
    frm, to, type_ = json.loads(header[o:o + lr])
    return {"tag": tag, "seq": seq, "t": t, "from": frm, "to": to, "type": type_,
            "bufs": json.loads(header[o + lr:o + lr + lb]), "body": json.loads(header[o + lr + lb:])}


def test_header_is_compact_and_signed_with_hmac_sha256():
    import hashlib
    import hmac
    s, _ = _pair()
    first = s.pack("ping", ME, {"n": 3})[0]
    sig, header = first[:32], first[32:]
    assert sig == hmac.new(KEY, header, hashlib.sha256).digest()
    h = _fields(header)
    assert (h["tag"], h["type"], h["from"], h["to"], h["seq"], h["body"]) == (P.COMPACT, "ping", YOU, ME, 1, {"n": 3})
    assert abs(h["t"] - P._now()) < 60


def test_a_hand_made_compact_header_is_read_and_the_old_json_one_refused():
    _, v = _pair()
    m = v.unpack(_resign(_header(body={"k": 1})))
    assert (m.type, m.sender, m.seq, m.body) == ("put", YOU, 7, {"k": 1})
    old = json.dumps({"v": 1, "type": "put", "from": YOU, "to": ME, "seq": 8, "t": P._now(), "bufs": [],
                      "body": {}}).encode()                      # the legacy JSON header: gone
    with pytest.raises(ProtocolError, match="malformed header.*tag"):
        v.unpack(_raw_bytes(old))


@pytest.mark.parametrize("cut", [
    lambda h: h[:10],                                             # shorter than the fixed fields
    lambda h: h[:21] + b'["a", "b"]' + h[21 + len(b'["a", "b"]'):],   # a route that is not [from, to, type]
    lambda h: h + b"x",                                           # trailing garbage after the body
    lambda h: h[:-1],                                             # a cut body
])
def test_signed_but_malformed_compact_headers_are_refused(cut):
    import hashlib
    import hmac
    s, v = _pair()
    header = cut(s.pack("put", ME, {"key": "x"})[0][32:])
    with pytest.raises(ProtocolError, match="malformed|addressed"):
        v.unpack([hmac.new(KEY, header, hashlib.sha256).digest() + header])


def test_non_contiguous_and_scalar_arrays_travel():
    s, v = _pair()
    a = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]
    m = v.unpack(s.pack("put", ME, None, [a, np.float64(2.5) * np.ones(())]))
    np.testing.assert_array_equal(m.buffers[0], a)
    assert m.buffers[1].shape == () and float(m.buffers[1]) == 2.5


def test_object_arrays_are_refused_when_sending():
    s, _ = _pair()
    with pytest.raises(TypeError, match="dtype object"):
        s.pack("put", ME, None, [np.array([object()])])


@pytest.mark.parametrize("mangle, why", [
    (lambda f: [], "no frames"),
    (lambda f: [b"garbage"], "unsigned or malformed"),
    (lambda f: [f[0][32:]], "bad signature|unsigned"),                       # header without signature
    (lambda f: [bytes(32) + f[0][32:]], "bad signature"),                     # zero signature
    (lambda f: [f[0][:40] + b"X" + f[0][41:]], "bad signature"),              # header changed in flight
    (lambda f: [f[0], b"extra"], "no buffers but 1 arrived"),                 # frame added
])
def test_tampered_messages_are_refused(mangle, why):
    s, v = _pair()
    with pytest.raises(ProtocolError, match=why):
        v.unpack(mangle(s.pack("ping", ME)))


def test_forged_key_and_short_keys():
    forger = P.Signer(b"x" * 32, YOU)
    _, v = _pair()
    with pytest.raises(ProtocolError, match="bad signature"):
        v.unpack(forger.pack("run", ME))
    with pytest.raises(ValueError, match="at least 16"):
        P.Signer(b"short", YOU)


def test_replay_is_refused_but_reordering_within_the_window_passes():
    s, v = _pair()
    f1, f2, f3 = (s.pack("ping", ME) for _ in range(3))
    v.unpack(f1)
    v.unpack(f3)                 # 2 is late, not lost
    v.unpack(f2)
    for f in (f1, f2, f3):
        with pytest.raises(ProtocolError, match="replayed"):
            v.unpack(f)


def test_replay_far_below_the_window_is_refused():
    g = P.ReplayGuard(window=8)
    g.check("a", 100, 0.0)
    with pytest.raises(ProtocolError, match="too late"):
        g.check("a", 50, 0.0)
    g.check("a", 95, 0.0)
    g.check("b", 1, 0.0)         # senders are counted apart


def test_a_failed_check_does_not_burn_the_sequence_number():
    s, v = _pair()
    good = s.pack("put", ME, None, [b"abc"])
    with pytest.raises(ProtocolError):
        v.unpack([good[0], b"abcd"])          # wrong length for its buffer
    v.unpack(good)


def test_messages_for_another_receiver_are_refused_except_hello():
    s, v = _pair()
    with pytest.raises(ProtocolError, match="addressed to 'server-other'"):
        v.unpack(s.pack("run", "server-other"))
    with pytest.raises(ProtocolError, match="addressed to '\\*'"):
        v.unpack(s.pack("run", "*"))
    assert v.unpack(s.pack("hello", "*")).type == "hello"


def test_stale_messages_are_refused(monkeypatch):
    s, v = _pair()
    frames = s.pack("ping", ME)
    monkeypatch.setattr(P, "_now", lambda: 10 ** 10)
    with pytest.raises(ProtocolError, match="stale"):
        v.unpack(frames)


def _raw_bytes(raw: bytes, bufs=(), key=KEY):
    import hashlib
    import hmac
    return [hmac.new(key, raw, hashlib.sha256).digest() + raw, *bufs]


def _resign(header: dict, bufs=(), key=KEY):
    """The frames of a compact header made by hand from ``header``'s fields (``route`` given whole
    replaces [from, to, type]), signed with ``key``."""
    import struct
    route = json.dumps(header.get("route", [header["from"], header["to"], header["type"]])).encode()
    descs = json.dumps(header["bufs"]).encode()
    fixed = struct.pack("<BQdHI", header["tag"], header["seq"], header["t"], len(route), len(descs))
    return _raw_bytes(fixed + route + descs + json.dumps(header["body"]).encode(), bufs, key)


def _header(**kw):
    h = {"tag": P.COMPACT, "type": "put", "from": YOU, "to": ME, "seq": 7, "t": P._now(), "bufs": [], "body": {}}
    h.update(kw)
    return h


@pytest.mark.parametrize("header, bufs, why", [
    (_header(bufs=[["nd", "<f4", [3]]]), [b"\0" * 8], "does not hold float32"),
    (_header(bufs=[["nd", "|O", [1]]]), [b"\0" * 8], "not allowed"),
    (_header(bufs=[["nd", "<f4", [-1]]]), [b""], "not allowed"),
    (_header(bufs=[["zz", 1]]), [b"x"], "unknown buffer kind"),
    (_header(bufs=[["p", 3, "00" * 32]]), [b"abc"], "digest"),
    (_header(bufs=[["b", 3]]), [], "lists 1 buffer"),
    (_header(seq=0), [], "bad seq"),
    (_header(tag=99), [], "malformed header"),
    (_header(route=["x"]), [], "malformed header"),
    (_header(route=[1, 2, 3]), [], "malformed header"),
    (_header(bufs={"a": 1}), [], "malformed header"),
    (_header(body=[1, 2]), [], "malformed header|body"),
    (_header(to="server-other"), [], "addressed to"),
    (_header(t=float("nan")), [], "stale"),                                    # NaN: fails the time window
    (_header(t=float("inf")), [], "stale"),
    (_header(t=P._now() - 10 ** 6), [], "stale"),
])
def test_signed_but_malformed_headers_are_refused(header, bufs, why):
    _, v = _pair()
    with pytest.raises(ProtocolError, match=why):
        v.unpack(_resign(header, bufs))


def test_signed_buffers_carry_digests():
    s, v = _pair()
    frames = s.pack("put", ME, None, [b"abc", np.ones(3)], sign_buffers=True)
    header = _fields(frames[0][32:])
    assert all(len(d[-1]) == 64 for d in header["bufs"])
    with pytest.raises(ProtocolError, match="digest"):
        v.unpack([frames[0], b"abd", frames[2]])


def test_loads_refuses_buffers_that_did_not_arrive_as_signed_pickles():
    with pytest.raises(ProtocolError, match="refusing to unpickle"):
        P.loads(pickle.dumps(1))


# -- code by value ----------------------------------------------------------------------------------
def _roundtrip(obj):
    return pickle.loads(P.dumps(obj))


SCALE = 3


def test_functions_defined_here_travel_with_their_globals_closures_and_defaults():
    offset = 10

    def f(x, y=2, *, z=5):
        return (x + y + z + offset) * SCALE

    g = _roundtrip(f)
    assert g(1) == f(1) == 54 and g(1, y=0, z=0) == 33
    assert g.__name__ == "f" and g is not f


def test_lambdas_nested_recursive_and_mutually_referring_functions():
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    def outer():
        def inner(k):
            return fact(k) + 1
        return inner

    assert _roundtrip(lambda a: a * 2)(21) == 42
    assert _roundtrip(fact)(5) == 120
    assert _roundtrip(outer())(4) == 25


def test_modules_travel_by_name_and_importable_functions_by_reference():
    import math
    fn = _roundtrip(lambda: math.sqrt(16) + np.sum(np.ones(2)))
    assert fn() == 6.0
    data = P.dumps(np.linalg.norm)
    assert b"norm" in data and len(data) < 200   # by reference, not by value
    assert pickle.loads(data) is np.linalg.norm


def test_only_globals_the_code_reads_are_sent():
    import threading
    lock = threading.Lock()     # unpicklable: must not be dragged along by an attribute of the same name

    class Obj:
        lock = 1

    def uses_attribute(o):
        return o.lock

    assert lock is not None
    assert _roundtrip(uses_attribute)(Obj) == 1


def test_a_notebooks_wrapper_of_open_is_not_sent(tmp_path):
    """IPython's namespace holds its own wrapper of ``open`` (functools.wraps(io.open)); a function
    that calls ``open`` travels with the worker's builtin instead of the wrapper and its globals."""
    import builtins
    import functools

    big = list(range(2000))     # what the wrapper's module would drag along

    @functools.wraps(builtins.open)
    def wrapper(*args, **kwargs):
        assert big
        return builtins.open(*args, **kwargs)

    ns = {"open": wrapper, "__name__": "__main__"}
    exec("def first_line(path):\n    with open(path) as f:\n        return f.readline()\n", ns)
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    data = P.dumps(ns["first_line"])
    assert len(data) < 1000, len(data)
    assert pickle.loads(data)(str(tmp_path / "a.txt")) == "hello\n"


def test_a_function_from_another_python_is_refused_clearly():
    from flowlab.cluster import _code
    with pytest.raises(RuntimeError, match="Python 2.7"):
        _code._skeleton((2, 7), b"", "f", "f", "__main__", 0)


# -- the fast reading of headers laid out as Signer writes them ---------------------------------------
def _full(v, frames):
    """What the full JSON parse makes of ``frames`` (the fast path turned off)."""
    v._fast = lambda header, frames: None
    try:
        return v.unpack(frames)
    finally:
        del v._fast


@pytest.mark.parametrize("make", [
    lambda s: s.pack("ping", ME),
    lambda s: s.pack("put", ME, {"key": "x", "n": [1, 2], "f": 0.5, "s": "a b\u00e9"}, [np.ones((2, 3), np.float32)]),
    lambda s: s.pack("put", ME, None, [np.arange(4), b"raw", P.dumps([1])]),
    lambda s: s.pack("put", ME, None, [np.ones(3)], sign_buffers=True),
    lambda s: s.reply(ME, 41),
    lambda s: s.reply(ME, 42, {"shape": [4], "dtype": "<f4"}, [np.ones(4, np.float32)]),
    lambda s: s.reply(ME, 43, {"re": 1, "x": 2}),
])
def test_fast_and_full_parse_agree(make):
    s, v = _pair()
    frames = make(s)
    fast = v.unpack(frames)
    full = _full(P.Verifier(KEY, ME), frames)
    assert (fast.type, fast.body, fast.sender, fast.seq, fast.nbytes) == (full.type, full.body, full.sender,
                                                                         full.seq, full.nbytes)
    assert len(fast.buffers) == len(full.buffers)
    for a, b in zip(fast.buffers, full.buffers):
        assert type(a) is type(b) and bytes(memoryview(a)) == bytes(memoryview(b))
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape
    with pytest.raises(ProtocolError, match="replayed"):       # the fast path keeps the replay guard
        v.unpack(frames)


def test_reply_body_is_the_handlers_plus_re_and_ok():
    s, v = _pair()
    assert v.unpack(s.reply(ME, 5)).body == {"re": 5, "ok": True}
    assert v.unpack(s.reply(ME, 6, {"n": 3})).body == {"re": 6, "ok": True, "n": 3}
    assert v.unpack(s.reply(ME, 7, {"ok": False})).body == {"re": 7, "ok": True}
    with pytest.raises(TypeError, match="dict"):
        s.reply(ME, 8, [1, 2])


def test_a_second_seq_in_the_body_is_a_body_field():
    _, v = _pair()
    m = v.unpack(_resign(_header(body={"a": 1, "seq": 9})))
    assert (m.seq, m.body) == (7, {"a": 1, "seq": 9})
