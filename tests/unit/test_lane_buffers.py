"""The local lane's reader on a socket pair, in one process: large frames land in reused buffers
without ever overwriting data somebody holds, and a listener's reader checks the signed header
before it allocates what a message announces (issue 14, items 1 and 9)."""
import socket
import struct

import numpy as np
import pytest

from flowlab.cluster import protocol as P
from flowlab.cluster import unix

pytestmark = pytest.mark.skipif(not unix.AVAILABLE, reason="no AF_UNIX on this platform")
KEY = P.new_key()
N = 1 << 18          # float32 elements: 1 MiB frames, well over the read buffer


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def deliver(a, b, reader, frames):
    """Send ``frames`` on ``a`` and read them off ``b``, a piece at a time (no threads)."""
    bufs, _ = unix.encode(frames)
    data = b"".join(bytes(x) for x in bufs)
    out = []
    a.setblocking(False)
    sent = 0
    for _ in range(100_000):
        if sent == len(data) and out:
            break
        if sent < len(data):
            try:
                sent += a.send(data[sent:sent + (1 << 20)])
            except BlockingIOError:
                pass
        assert reader.read(b, out)
    assert len(out) == 1
    return out[0]


def test_a_held_tensor_is_never_overwritten_and_a_released_buffer_is_reused(pair):
    a, b = pair
    reader = unix.Reader()
    signer, verifier = P.Signer(KEY, "s"), P.Verifier(KEY, "r")

    def receive(value):
        frames = deliver(a, b, reader, signer.pack("put", "r", {}, [np.full(N, value, np.float32)]))
        return verifier.unpack(frames).buffers[0]

    x1 = receive(1.0)
    x2 = receive(2.0)
    x3 = receive(3.0)                       # x1 and x2 are held: fresh memory again
    assert (x1 == 1).all() and (x2 == 2).all() and (x3 == 3).all()
    view = x2[10:20].reshape(2, 5)          # a view keeps x2's buffer taken, even after x2 goes
    del x1, x2
    x4 = receive(4.0)
    assert (view == 2).all(), "a view the user holds was overwritten"
    assert (x3 == 3).all() and (x4 == 4).all()
    del view, x3
    x5 = receive(5.0)
    x6 = receive(6.0)
    assert (x4 == 4).all() and (x5 == 5).all() and (x6 == 6).all()
    del x5
    x7 = receive(7.0)                       # x5's buffer is free now: the pool hands it out again
    assert (x4 == 4).all() and (x6 == 6).all() and (x7 == 7).all()


def test_a_buffer_is_reused_once_nothing_refers_to_it(pair):
    a, b = pair
    reader = unix.Reader()
    signer, verifier = P.Signer(KEY, "s"), P.Verifier(KEY, "r")
    frames = signer.pack("put", "r", {}, [np.ones(N, np.float32)])
    x = verifier.unpack(deliver(a, b, reader, frames)).buffers[0]
    first = x.__array_interface__["data"][0]
    del x
    frames = signer.pack("put", "r", {}, [np.ones(N, np.float32)])
    y = verifier.unpack(deliver(a, b, reader, frames)).buffers[0]
    assert y.__array_interface__["data"][0] == first


def test_an_unsigned_header_is_refused_before_the_announced_buffer_is_allocated(pair, monkeypatch):
    a, b = pair
    verifier = P.Verifier(KEY, "r")
    taken = []
    reader = unix.Reader(admit=verifier.admit)
    class Recording:
        def take(self, n):
            taken.append(n)
            return unix._big(n)
    monkeypatch.setattr(reader, "_pool", Recording())
    a.sendall(struct.pack("<IQQ", 2, 64, 1 << 30) + b"u" * 64)
    with pytest.raises(unix.Garbage, match="refused before its buffers were received"):
        reader.read(b, [])
    assert taken == []


def test_a_signed_header_must_list_the_announced_sizes(pair):
    a, b = pair
    reader = unix.Reader(admit=P.Verifier(KEY, "r").admit)
    first = P.Signer(KEY, "s").pack("put", "r", {}, [np.ones(N, np.float32)])[0]
    a.sendall(struct.pack("<IQQ", 2, len(first), 4 * N + 4) + first)
    with pytest.raises(unix.Garbage, match="the signed header lists"):
        reader.read(b, [])


def test_a_signed_message_passes_the_check_and_marks_the_stream_verified(pair):
    a, b = pair
    verifier = P.Verifier(KEY, "r")
    reader = unix.Reader(admit=verifier.admit)
    assert not reader.verified
    frames = deliver(a, b, reader, P.Signer(KEY, "s").pack("put", "r", {}, [np.ones(N, np.float32)]))
    assert reader.verified
    assert (verifier.unpack(frames).buffers[0] == 1).all()


def test_admit_refuses_a_replay_and_a_frame_over_the_limit(monkeypatch):
    verifier = P.Verifier(KEY, "r")
    frames = P.Signer(KEY, "s").pack("put", "r", {}, [np.ones(16, np.float32)])
    verifier.admit(frames[0], [64])
    verifier.unpack(frames)
    with pytest.raises(P.ProtocolError, match="replayed"):
        verifier.admit(frames[0], [64])
    monkeypatch.setattr(P, "MAX_FRAME", 32)
    frames = P.Signer(KEY, "s2").pack("put", "r", {}, [np.ones(16, np.float32)])
    with pytest.raises(P.ProtocolError, match="over the limit"):
        verifier.admit(frames[0], [64])


def test_a_bad_max_frame_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLOWLAB_MAX_FRAME_MB", "lots")
    with pytest.raises(ValueError, match="FLOWLAB_MAX_FRAME_MB"):
        P._max_frame_from_env()
