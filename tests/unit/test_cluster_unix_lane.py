"""The local lane's framing (flowlab.cluster.unix) over a socketpair in this process: messages come
out whole however the stream is split, large frames land in memory of their own, and a stream that
breaks the framing is reported as Garbage."""
import os
import select
import socket
import struct
import threading

import numpy as np
import pytest

from flowlab.cluster import unix
from flowlab.cluster.protocol import Signer, Verifier, new_key

pytestmark = pytest.mark.skipif(not unix.AVAILABLE, reason="no AF_UNIX on this platform")


def stream(frames_list):
    out = b""
    for frames in frames_list:
        bufs, total = unix.encode(frames)
        data = b"".join(bytes(b) for b in bufs)
        assert len(data) == total
        out += data
    return out


def read_all(data, step):
    """Feed ``data`` into a socketpair ``step`` bytes per write (from a thread) and read it with a
    Reader; the messages read by the end of the stream."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.setblocking(False)
    reader, out = unix.Reader(), []

    def feed():
        try:
            for i in range(0, len(data), step):
                a.sendall(data[i:i + step])
        finally:
            a.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        while True:
            select.select([b], [], [], 5)
            try:
                if not reader.read(b, out):
                    break
            except unix.Garbage:
                raise
    finally:
        t.join(10)
        a.close()
        b.close()
    return out


@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_messages_come_out_whole_however_the_stream_is_split(step):
    big = np.arange(100_000, dtype=np.float32)           # 400 KB: received in place
    msgs = [[b"header-one"], [b"h2", b"", b"x" * 70_000, big], [b"h3", np.float64(2.5).tobytes()]]
    if step == 1:
        msgs[1][2] = b"x" * 100                           # keep the byte-by-byte case quick
        big = big[:1000]
        msgs[1][3] = big
    out = read_all(stream(msgs), step)
    assert len(out) == 3
    assert [bytes(f) for f in out[0]] == [b"header-one"]
    assert bytes(out[1][0]) == b"h2" and bytes(out[1][1]) == b"" and bytes(out[1][2]) == bytes(msgs[1][2])
    np.testing.assert_array_equal(np.frombuffer(out[1][3], np.float32), big)
    assert out[0][0].__class__ is bytes                   # the signed header is bytes, as from ZeroMQ


def test_signed_frames_survive_the_lane_and_pass_the_verifier():
    key = new_key()
    a = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    frames = Signer(key, "client-a").pack("op", "server-b", {"k": 1}, [a, np.float32(3.0)])
    out = read_all(stream([frames]), 1 << 16)
    msg = Verifier(key, "server-b").unpack(out[0])
    np.testing.assert_array_equal(msg.buffers[0], a)
    assert msg.buffers[1].shape == () and msg.buffers[1] == 3.0


@pytest.mark.parametrize("data, why", [
    (struct.pack("<I", 0) + b"rest", "bad frame count 0"),
    (struct.pack("<I", unix.MAX_FRAMES + 1) + b"rest", "bad frame count"),
    (struct.pack("<IQ", 1, unix.MAX_FRAME + 1), "a frame of"),
])
def test_a_stream_that_breaks_the_framing_is_garbage(data, why):
    with pytest.raises(unix.Garbage, match=why) as info:
        read_all(data, 1 << 16)
    assert info.value.data


def test_a_connection_sends_large_messages_while_the_peer_reads():
    """A blocked send waits for the reader (no deadlock, nothing lost) and the frames arrive intact."""
    d = unix.lane_dir(create=True)
    assert d is not None and not os.stat(d).st_mode & 0o077
    path = os.path.join(d, f"test-{os.getpid()}.sock")
    side = unix.UnixSide(path)
    try:
        conn = unix.UnixConnection("127.0.0.1:1", path)
        big = np.random.default_rng(1).standard_normal(3 << 20).astype(np.float32)   # 12 MiB
        got = []

        def serve():
            side.accept()
            while not side.peers:
                side.accept()
            fd = next(iter(side.peers))
            while not got:
                side.readable(fd, got)
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        conn.send([b"head", big])
        t.join(30)
        assert got and bytes(got[0][1][0]) == b"head"
        np.testing.assert_array_equal(np.frombuffer(got[0][1][1], np.float32), big)
        peer = got[0][0]
        assert side.send(peer, [b"answer", big[:10]])
        reply = conn.recv(5)
        assert bytes(reply[0]) == b"answer" and np.frombuffer(reply[1], np.float32).tolist() == big[:10].tolist()
        assert conn.recv(0) is None
        conn.close()
    finally:
        side.close()
    assert not os.path.exists(path)


def test_a_waiting_connection_spins_only_after_quick_answers_and_keeps_its_deadline(monkeypatch):
    """The spin before sleeping (unix.SPIN) never cuts a wait short or makes it longer than asked,
    and is turned off by a slow answer and on again by a quick one."""
    import time
    monkeypatch.setattr(unix, "SPIN", 0.05)
    d = unix.lane_dir(create=True)
    path = os.path.join(d, f"test-spin-{os.getpid()}.sock")
    side = unix.UnixSide(path)
    try:
        conn = unix.UnixConnection("127.0.0.1:1", path)
        conn.send([b"hello"])
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            side.accept()
            for fd in list(side.peers):
                side.readable(fd, got)
        peer = got[0][0]
        assert conn._spin is True                  # a new connection starts hopeful
        t0 = time.monotonic()
        assert conn.recv(0.2) is None              # nothing comes: the full wait, then None
        assert 0.19 <= time.monotonic() - t0 < 5
        assert conn._spin is False                 # a slow (here: no) answer turns the spin off
        side.send(peer, [b"quick"])
        assert bytes(conn.recv(5)[0]) == b"quick"
        assert conn._spin is True                  # the answer was there at once: spin next time
        threading.Timer(0.3, side.send, (peer, [b"late"])).start()   # well past 2 * SPIN: a slow answer
        assert bytes(conn.recv(5)[0]) == b"late"  # came after the spin ended: slept, then read it
        assert conn._spin is False
        conn.close()
    finally:
        side.close()


def test_no_lane_for_other_hosts_or_when_turned_off(monkeypatch):
    assert unix.lane_path("10.1.2.3", 5000) is None
    assert unix.lane_path("example.org", 5000) is None
    assert unix.lane_path("localhost", 5000) == unix.lane_path("127.0.0.1", 5000)
    monkeypatch.setenv("FLOWLAB_LOCAL_LANE", "0")
    assert unix.lane_path("127.0.0.1", 5000) is None


def test_stale_socket_files_are_swept_and_live_ones_kept(monkeypatch):
    d = unix.lane_dir(create=True)
    stale, fresh = (os.path.join(d, f"test-{kind}-{os.getpid()}.sock") for kind in ("stale", "fresh"))
    for path in (stale, fresh):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)                  # bound, never listening: what a killed process leaves
        s.close()
    os.utime(stale, (1, 1))           # long ago
    live = unix.UnixSide(os.path.join(d, f"test-live-{os.getpid()}.sock"))
    os.utime(live.path, (1, 1))
    monkeypatch.setattr(unix, "_swept", False)
    side = unix.UnixSide(os.path.join(d, f"test-new-{os.getpid()}.sock"))
    try:
        assert not os.path.exists(stale)               # dead and old: removed
        assert os.path.exists(fresh)                   # dead but young: left (it may be starting)
        assert os.path.exists(live.path)               # listening: kept
    finally:
        side.close()
        live.close()
        os.unlink(fresh)
    assert not os.path.exists(side.path) and not os.path.exists(live.path)
