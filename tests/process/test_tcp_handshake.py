"""What a peer without the cluster's key can make a worker hold over TCP (issue 14, item 1).

Before: a raw TCP client that sent ZeroMQ's greeting and then a handshake command (or, with the
NULL mechanism, a message) claiming 1 GiB made the worker hold what it streamed (~870 MiB in 7 s):
libzmq allocates handshake commands up to ZMQ_MAXMSGSIZE, which was 4 GiB. Now every TCP socket
makes a keyed handshake (PLAIN with a password derived from the key, or CURVE) and takes parts of at
most ``transport.CHUNK`` bytes (1 MiB), so such a peer is dropped as soon as it announces the size.

Every process started here is ended by the make_cluster fixture, even when a test fails.
"""
import socket
import struct
import threading
import time

import pytest

pytest.importorskip("zmq")

import flowlab.cluster as fc  # noqa: E402
from flowlab.cluster import protocol as P  # noqa: E402
from flowlab.cluster import transport as T  # noqa: E402
from flowlab.cluster.errors import ClusterError  # noqa: E402

pytestmark = pytest.mark.process
RSS_BOUND = 64 << 20        # what the attack may add to the worker's resident memory
STREAM_S = 3.0              # how long each attacker streams


def rss(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def greeting(mechanism: bytes) -> bytes:
    """ZMTP 3.0's greeting (64 bytes): signature, version 3.0, mechanism, as-server 0, filler."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\0") + b"\0" + b"\0" * 31


class Streamer(threading.Thread):
    """A raw TCP peer: greeting, then a frame header claiming ``size`` bytes (``command``: a
    handshake command, else a message), then data for STREAM_S seconds or until dropped."""

    def __init__(self, address, mechanism, command, size=1 << 30):
        super().__init__(daemon=True)
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.mechanism, self.flags, self.size = mechanism, 0x06 if command else 0x02, size
        self.sent = 0
        self.dropped = False
        self.held = None          # seconds from the greeting until the worker closed the connection

    def run(self):
        s = self.sock
        chunk = b"\1" * (1 << 20)
        start = time.monotonic()
        end = start + STREAM_S
        try:
            s.sendall(greeting(self.mechanism) + bytes([self.flags]) + struct.pack(">Q", self.size))
            s.settimeout(0.2)
            while time.monotonic() < end:
                try:
                    self.sent += s.send(chunk)
                except socket.timeout:
                    continue
            s.settimeout(max(0.1, end + 3 - time.monotonic()))
            while s.recv(1 << 16):       # what the worker says (its greeting) is read and dropped
                pass
            self.dropped = True
        except OSError:                  # reset by the worker: dropped
            self.dropped = True
        finally:
            s.close()
        if self.dropped:
            self.held = time.monotonic() - start


@pytest.fixture
def tcp_only(monkeypatch):
    monkeypatch.setenv("FLOWLAB_LOCAL_LANE", "0")


def test_raw_peers_claiming_1_gib_in_the_handshake_cost_the_worker_little(make_cluster, tcp_only):
    c = make_cluster(workers=1)
    task = c.workers[0]
    assert c.client.lane(task) == "tcp"
    address, pid = c.spec.address_of(task), c.pid(task)
    assert c.run(lambda: "warm", timeout=10) == ["warm"]
    before = rss(pid)
    attackers = [Streamer(address, m, command) for m in (b"PLAIN", b"CURVE", b"NULL")
                 for command in (True, False) for _ in range(2)]
    for a in attackers:
        a.start()
    peak = before
    end = time.monotonic() + STREAM_S
    while time.monotonic() < end:          # valid calls go on while they stream
        assert c.client.request(task, "ping", timeout=10).body["ok"]
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    for a in attackers:
        a.join(STREAM_S + 10)
    peak = max(peak, rss(pid))
    print(f"{len(attackers)} raw peers claiming 1 GiB: worker RSS +{(peak - before) / 2**20:.1f} MiB at most, "
          f"{sum(a.sent for a in attackers) / 2**20:.1f} MiB of theirs taken in all, dropped after at most "
          f"{max(a.held or 0 for a in attackers):.2f} s")
    assert peak - before < RSS_BOUND, f"worker RSS grew by {(peak - before) >> 20} MiB for unauthenticated peers"
    assert all(a.dropped for a in attackers), "the worker kept a connection that announced 1 GiB"
    assert sum(a.sent for a in attackers) < len(attackers) * (16 << 20), "the worker kept reading their data"
    stats = c.client.request(task, "stats").body
    assert c.run(lambda: "serving", timeout=10) == ["serving"]
    assert stats["dropped"] == 0, "something of theirs reached the worker's verifier"


def test_a_client_with_the_wrong_key_is_refused_at_once(make_cluster, tcp_only):
    c = make_cluster(workers=1)
    task = c.workers[0]
    address = c.spec.address_of(task)
    stranger = fc.Client(P.new_key())
    start = time.monotonic()
    try:
        with pytest.raises(ClusterError, match="cluster key") as e:
            stranger.add(task, address, timeout=30)
    finally:
        stranger.close()
    assert address in str(e.value)
    assert time.monotonic() - start < 10, "the refusal waited out the client's timeout"
    assert c.client.request(task, "ping").body["ok"]


def test_a_peer_with_the_key_sending_a_part_over_the_limit_is_dropped(make_cluster, tcp_only):
    zmq = pytest.importorskip("zmq")
    c = make_cluster(workers=1)
    task = c.workers[0]
    address, pid = c.spec.address_of(task), c.pid(task)
    server_id = c.client._peers[task].server_id
    before = rss(pid)
    s = T.context().socket(zmq.DEALER)
    s.linger = 0
    s.maxmsgsize = -1
    T.apply_key(s, c.key)
    s.connect(f"tcp://{address}")
    try:
        header = P.Signer(c.key, "client-big").pack("put", server_id, {"key": "k"}, [b"\0" * (64 << 20)])
        s.send_multipart(header, copy=False)           # one part of 64 MiB: over ZMQ_MAXMSGSIZE
        time.sleep(1.0)
        assert rss(pid) - before < RSS_BOUND
        assert "k" not in c.client.request(task, "stats").body.get("keys", ())
        assert c.client.request(task, "ping").body["ok"]
    finally:
        s.close(0)
