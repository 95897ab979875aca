"""What a peer without the cluster's key can do to a live worker, on each lane (issue 14, item 1).

A real worker process is sent random, truncated, oversized, reordered, forged, tampered and replayed
frames for a bounded time (FUZZ_SECONDS, 3 s each lane by default; ``FLOWLAB_FUZZ_SECONDS`` for a
longer soak), with valid calls between them. It must stay up, answer every valid call, execute
nothing it was not validly asked to (a forged ``run`` would create a directory; a replayed one would
append to a file a second time), and its memory (VmRSS) must stay within RSS_BOUND of where it started.
The 1 GiB-preamble reproduction and the silent-peer deadline have tests of their own.

Every process started here is ended by the make_cluster fixture, even when a test fails.
"""
import os
import random
import socket
import struct
import time

import numpy as np
import pytest

from flowlab.cluster import protocol as P
from flowlab.cluster import unix

pytestmark = [pytest.mark.process]
FUZZ_SECONDS = float(os.environ.get("FLOWLAB_FUZZ_SECONDS", "3"))
RSS_BOUND = 100 << 20      # what the fuzz may add to a worker's resident memory (it holds ~40 MiB at most)
MAX_FRAME_MB = 8           # the workers' FLOWLAB_MAX_FRAME_MB in the fuzz: "oversized" means over this
needs_lane = pytest.mark.skipif(not unix.AVAILABLE, reason="no AF_UNIX on this platform")


def rss(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def lane_of(c, task):
    host, _, port = c.spec.address_of(task).rpartition(":")
    return unix.lane_path(host, int(port))


def on_stream(frames) -> bytes:
    """``frames`` as the local lane puts them on the stream."""
    bufs, _ = unix.encode(frames)
    return b"".join(bytes(b) for b in bufs)


def closed_by_peer(s, limit) -> bool:
    """Whether the other end closes ``s`` within ``limit`` seconds (what it sends is read and dropped)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            if s.recv(1 << 16) == b"":
                return True
        except socket.timeout:
            return False
        except OSError:
            return True
    return False


@pytest.fixture
def lane_env(monkeypatch):
    monkeypatch.delenv("FLOWLAB_LOCAL_LANE", raising=False)


# -- the reproduction of the issue ---------------------------------------------------------------------
@needs_lane
def test_a_preamble_announcing_1_gib_costs_the_worker_no_memory(make_cluster, lane_env):
    c = make_cluster(workers=1)
    task = c.workers[0]
    pid = c.pid(task)
    before = rss(pid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(lane_of(c, task))
        s.sendall(struct.pack("<IQ", 1, 1 << 30))          # 12 bytes, unsigned: "a frame of 1 GiB follows"
        assert closed_by_peer(s, 3), "the worker kept a connection that announced a 1 GiB first frame"
        # an unsigned small first frame, then 1 GiB announced for the next one, and 64 MiB of it sent
        s2.connect(lane_of(c, task))
        s2.sendall(struct.pack("<IQQ", 2, 100, 1 << 30) + os.urandom(100))
        chunk = b"\1" * (1 << 20)
        try:
            for _ in range(64):
                s2.sendall(chunk)
        except OSError:
            pass                                           # closed once the header failed: expected
        assert closed_by_peer(s2, 3)
        time.sleep(0.2)
        grown = rss(pid) - before
        assert grown < 48 << 20, f"worker RSS grew by {grown >> 20} MiB for unsigned frames"
        assert c.client.request(task, "ping").body["ok"]
        assert c.client.request(task, "stats").body["dropped"] >= 2
    finally:
        s.close()
        s2.close()


@needs_lane
def test_a_silent_connection_is_closed_after_the_handshake_deadline(make_cluster, lane_env):
    c = make_cluster(workers=1)
    path = lane_of(c, c.workers[0])
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.connect(path)
        partial.connect(path)
        partial.sendall(struct.pack("<IQ", 1, 50) + b"x" * 20)   # a message that never finishes
        start = time.monotonic()
        assert closed_by_peer(silent, unix.HANDSHAKE + 3)
        assert closed_by_peer(partial, 3)
        assert time.monotonic() - start >= unix.HANDSHAKE - 0.5  # not before its deadline
    finally:
        silent.close()
        partial.close()


@needs_lane
def test_a_valid_connection_idle_past_the_deadline_still_works(make_cluster, lane_env):
    c = make_cluster(workers=1)
    task = c.workers[0]
    server_id = c.client._peers[task].server_id
    conn = unix.UnixConnection(c.spec.address_of(task), lane_of(c, task))
    signer = P.Signer(c.key, "client-idle")
    verifier = P.Verifier(c.key, "client-idle")
    try:
        time.sleep(unix.HANDSHAKE + 1)            # the worker closes it meanwhile: it never spoke
        big = np.arange(1 << 20, dtype=np.float32)
        conn.send(signer.pack("put", server_id, {"key": "idle"}, [big]))
        reply = verifier.unpack(conn.recv(10))
        assert reply.body["ok"], reply.body
        np.testing.assert_array_equal(c.client.request(task, "get", {"key": "idle"}).buffers[0], big)
    finally:
        conn.close()


@needs_lane
def test_a_signed_header_must_list_the_sizes_that_follow(make_cluster, lane_env):
    c = make_cluster(workers=1)
    task = c.workers[0]
    server_id = c.client._peers[task].server_id
    signer = P.Signer(c.key, "client-sizes")
    first, _ = signer.pack("put", server_id, {"key": "k"}, [np.zeros(1 << 16, np.float32)])   # 256 KiB
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(lane_of(c, task))
        s.sendall(struct.pack("<IQQ", 2, len(first), 1 << 29) + first)   # the header says 256 KiB, 512 MiB announced
        assert closed_by_peer(s, 3)
        assert "refused before its buffers were received" in c.logs(0)
        assert c.client.request(task, "ping").body["ok"]
    finally:
        s.close()


# -- the fuzz --------------------------------------------------------------------------------------------
def _append(path):
    with open(path, "a") as f:
        f.write("x")


class Attack:
    """The frames of one fuzz round: what a peer without the key (or replaying) might send."""

    def __init__(self, c, task, tmp_path, rng):
        self.rng = rng
        self.server_id = c.client._peers[task].server_id
        self.forged_dir = str(tmp_path / "forged")
        self.appended = str(tmp_path / "appended")
        self.signer = P.Signer(c.key, "client-fuzz")
        stranger = P.Signer(os.urandom(32), "client-fuzz")     # same name, wrong key
        run = lambda signer, fn, *args: signer.pack("run", self.server_id, {}, [P.dumps(fn), P.dumps((args, {}))])
        self.forged = run(stranger, os.mkdir, self.forged_dir)
        self.valid_run = run(self.signer, _append, self.appended)   # sent once for real, then replayed
        good = run(self.signer, os.mkdir, self.forged_dir)
        self.tampered = [
            [good[0][:40] + bytes([good[0][40] ^ 1]) + good[0][41:], *good[1:]],        # a header bit
            [good[0], good[1][:-1] + bytes([good[1][-1] ^ 1]), good[2]],               # the pickle
            [good[0], good[2], good[1]],                                               # reordered
        ]

    def messages(self):
        """A random message (list of frames), or raw bytes when the framing itself is the attack."""
        r = self.rng
        kind = r.randrange(9)
        if kind == 0:
            return r.randbytes(r.randrange(1, 300))
        if kind == 1:
            return [r.randbytes(r.randrange(0, 200)) for _ in range(r.randrange(1, 5))]
        if kind == 2:
            return self.forged
        if kind == 3:
            return r.choice(self.tampered)
        if kind == 4:
            return self.valid_run                          # a replay
        if kind == 5:                                      # truncated: a valid encoding cut short
            raw = on_stream(self.valid_run)
            return raw[:r.randrange(1, len(raw))]
        if kind == 6:                                      # oversized: announced, never sent
            return struct.pack("<IQQ", 2, 64, r.choice([MAX_FRAME_MB << 21, 1 << 30, 1 << 40])) + r.randbytes(64)
        if kind == 7:                                      # an oversized frame actually sent
            return [self.forged[0], b"\0" * ((MAX_FRAME_MB << 20) + 4096)]
        return [self.forged[0], r.randbytes(r.randrange(1, 1 << 17))]   # wrong-key header, random buffer


def _fuzz(c, send_one, attack, least_dropped):
    """Send attack messages for FUZZ_SECONDS with a valid call every 25; return the round count."""
    task = c.workers[0]
    pid = c.pid(task)
    before = rss(pid)
    peak = before
    end = time.monotonic() + FUZZ_SECONDS
    rounds = 0
    while time.monotonic() < end and rounds < 100_000:
        send_one(attack.messages())
        rounds += 1
        if rounds % 25 == 0:
            assert c.client.request(task, "ping", timeout=10).body["ok"]
            peak = max(peak, rss(pid))
    time.sleep(0.3)
    peak = max(peak, rss(pid))
    assert peak - before < RSS_BOUND, f"worker RSS grew by {(peak - before) >> 20} MiB under the fuzz"
    assert not os.path.exists(attack.forged_dir), "a forged or tampered run message was executed"
    with open(attack.appended) as f:
        assert f.read() == "x", "a replayed run message was executed again"
    assert c.run(lambda: "serving", timeout=10) == ["serving"]
    dropped = c.client.request(task, "stats").body["dropped"]
    assert dropped >= least_dropped(rounds), f"{dropped} of {rounds} attack messages were seen and dropped"
    return rounds


@needs_lane
def test_fuzz_the_local_lane(make_cluster, lane_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWLAB_MAX_FRAME_MB", str(MAX_FRAME_MB))
    c = make_cluster(workers=1)
    task = c.workers[0]
    path = lane_of(c, task)
    assert path and os.path.exists(path)
    attack = Attack(c, task, tmp_path, random.Random(1401))
    conn = unix.UnixConnection(c.spec.address_of(task), path)
    conn.send(attack.valid_run)                          # the one real execution
    assert P.Verifier(c.key, "client-fuzz").unpack(conn.recv(10)).body["ok"]
    conn.close()

    def send_one(msg):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            s.setblocking(False)
            data = msg if isinstance(msg, bytes) else on_stream(msg)
            try:
                s.send(data)             # what the socket takes now; a worker that closed early is fine
            except OSError:
                pass
        finally:
            s.close()

    rounds = _fuzz(c, send_one, attack, lambda rounds: rounds // 4)
    assert rounds > 50


def chunked(msg, rng):
    """``msg`` (a list of frames) in the TCP lane's chunked form (see transport._send_parts), with a
    layout that lies now and then (sizes announced but not sent, or 1 GiB, or a ragged layout)."""
    sizes = [len(f) for f in msg[1:]]
    layout = struct.pack(f"<{len(sizes)}Q", *sizes)
    lie = rng.randrange(4)
    if lie == 1:
        layout = struct.pack("<Q", 1 << 30) + layout[8:]
    elif lie == 2:
        layout = layout + b"\1"
    elif lie == 3:
        layout = struct.pack(f"<{len(sizes) + 1}Q", *sizes, MAX_FRAME_MB << 21)
    parts = [b"", layout, msg[0]]
    for f in msg[1:]:
        parts += [f[i:i + 4096] for i in range(0, len(f), 4096)] or [b""]
    return parts


def test_fuzz_tcp(make_cluster, monkeypatch, tmp_path):
    """The same attacks over TCP, sent through a ZeroMQ DEALER that made the keyed handshake (what
    a peer holding the key could send: the signature still stops it), as plain and chunked
    messages; beside it, DEALERs with no key or the wrong one, which get nothing through."""
    zmq = pytest.importorskip("zmq")
    from flowlab.cluster import transport as T
    monkeypatch.setenv("FLOWLAB_LOCAL_LANE", "0")
    monkeypatch.setenv("FLOWLAB_MAX_FRAME_MB", str(MAX_FRAME_MB))
    c = make_cluster(workers=1)
    task = c.workers[0]
    assert c.client.lane(task) == "tcp"
    host, _, port = c.spec.address_of(task).rpartition(":")
    rng = random.Random(1402)
    attack = Attack(c, task, tmp_path, rng)
    ctx = zmq.Context()

    def dealer(key):
        d = ctx.socket(zmq.DEALER)
        d.linger = 0
        d.sndhwm = 100
        T.apply_key(d, key)
        d.connect(f"tcp://{host}:{port}")
        return d

    keyed, strangers = dealer(c.key), [dealer(None), dealer(os.urandom(32))]
    try:
        keyed.send_multipart(attack.valid_run)
        assert keyed.poll(10_000), "no answer to the valid run message"
        assert P.Verifier(c.key, "client-fuzz").unpack(keyed.recv_multipart()[0:]).body["ok"]

        def send_one(msg):
            if isinstance(msg, bytes):       # raw bytes on a plain TCP connection: not even ZMTP
                with socket.create_connection((host, int(port)), timeout=2) as s:
                    try:
                        s.sendall(msg)
                    except OSError:
                        pass
                return
            how = rng.randrange(4)
            d = keyed if how < 3 else strangers[rng.randrange(2)]
            if how == 2:
                msg = chunked(msg, rng)
            try:
                d.send_multipart(msg, flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                pass
            while keyed.poll(0):
                keyed.recv_multipart()       # error replies to messages that passed (none should)

        rounds = _fuzz(c, send_one, attack, lambda rounds: 10)   # ZeroMQ itself drops bad framing
        assert rounds > 50
        assert not any(d.poll(0) for d in strangers), "a peer without the key was answered"
        assert "refused before its buffers were received" in c.logs(0)   # chunked lies were seen
    finally:
        for d in (keyed, *strangers):
            d.close(0)
        ctx.term()
