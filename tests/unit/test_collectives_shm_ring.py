"""The shared-memory ring (flowlab/cluster/collectives/shm.py) on its own: two threads, and two
processes (one of them SIGKILLed), with rings far smaller than the messages."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from flowlab.cluster.collectives import shm

pytestmark = pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))


def _ours():
    return sorted(f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"flowlab-{os.getpid()}-"))


class Pair:
    """Both ends of one ring in this process, with the consumer's wait done as the communicator does."""

    def __init__(self, capacity):
        self.tx = shm.poke_socket()
        self.rx = shm.Waker()
        self.inb = shm.Inbound(0, self.tx, capacity=capacity)
        self.out = shm.Outbound(self.inb.name, self.rx.name, self.tx)
        # the sending thread never waits here: its Pusher moves what does not fit
        self.pusher = shm.Pusher({1: self.out}, busy=lambda: False, gone=lambda peer: False)

    def send(self, header, arrays):
        if not self.out.send(header, arrays):
            self.pusher.notify()

    def recv(self, timeout=20.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self.inb.pump()
            if got is not None:
                return got
            self.inb.set_waiting(True)
            shm.fence()
            if not self.inb.ready():
                self.rx.wait(0.1)
            self.inb.set_waiting(False)
        raise TimeoutError("nothing arrived")

    def close(self):
        self.pusher.close()
        self.out.close()
        self.inb.close()
        self.rx.close()
        self.tx.close()


@pytest.fixture(params=["x86", "weak"] if shm.STRONG_ORDER else ["weak"])
def pair(request, monkeypatch):
    if request.param == "weak":          # the fd-only protocol of other architectures
        monkeypatch.setattr(shm, "STRONG_ORDER", False)
    p = Pair(1 << 16)
    yield p
    p.close()


def test_the_name_is_gone_once_both_ends_are_mapped(pair):
    assert not os.path.exists(pair.inb.path) and _ours() == []


def test_a_sender_thread_and_a_receiver_thread_through_a_small_ring(pair):
    rng = np.random.default_rng(1)
    sizes = [int(rng.integers(0, 40_000)) for _ in range(200)] + [300_000, 1 << 20]   # up to 16x the ring
    msgs = [({"i": i, "tag": ["x", None, 1.5, True], "d": {"k": [1, 2]}},
             [rng.random(n // 8 + 1).astype(np.float32), np.zeros((2, 0), np.int8), np.array(i % 2 == 0)])
            for i, n in enumerate(sizes)]

    def sender():
        for header, arrays in msgs:
            pair.send(header, arrays)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    for header, arrays in msgs:
        got_header, got = pair.recv()
        assert got_header == header
        for x, y in zip(arrays, got):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y) and y.flags.c_contiguous
    t.join(10)


def test_send_copies_what_does_not_fit_so_the_caller_may_reuse_its_buffer(pair):
    buf = np.arange(200_000, dtype=np.float64)         # 1.6 MB through a 64 KiB ring
    pair.send({}, [buf])
    buf[:] = -1
    _, (got,) = pair.recv()
    assert np.array_equal(got, np.arange(200_000, dtype=np.float64))


def test_a_header_marshal_cannot_carry_is_refused_by_name(pair):
    with pytest.raises(TypeError, match="header"):
        pair.send({"f": print}, [])


def test_a_bad_capacity_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        shm.Inbound(0, shm.poke_socket(), capacity=1000)


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from flowlab.cluster.collectives import shm
    name, rx, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tx = shm.poke_socket()
    out = shm.Outbound(name, rx, tx)
    pusher = shm.Pusher({0: out}, busy=lambda: False, gone=lambda peer: False)
    print("ready", flush=True)
    for i in range(n):
        if not out.send({"i": i}, [np.full(1 << 20, i, np.uint8)]):
            pusher.notify()
    print("sent", flush=True)
    time.sleep(600)
""")


def _child(inb, rx, n):
    return subprocess.Popen([sys.executable, "-c", CHILD, inb.name, rx.name, str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_another_process_streams_64_mib_through_a_1_mib_ring_and_leaves_nothing_behind():
    tx, rx = shm.poke_socket(), shm.Waker()
    inb = shm.Inbound(1, tx, capacity=1 << 20)
    proc = _child(inb, rx, 64)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.poll() is not None else ""
        for i in range(64):
            end = time.monotonic() + 30
            while (got := inb.pump()) is None:
                assert time.monotonic() < end, "the stream stalled"
                inb.set_waiting(True)
                shm.fence()
                if not inb.ready():
                    rx.wait(0.1)
                inb.set_waiting(False)
            header, (x,) = got
            assert header == {"i": i} and x.size == 1 << 20 and x[0] == i and x[-1] == i
        assert proc.stdout.readline().strip() == "sent"
        assert _ours() == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        inb.close()
        rx.close()
        tx.close()
    assert _ours() == []


def test_a_sender_killed_mid_stream_leaves_nothing_in_dev_shm():
    tx, rx = shm.poke_socket(), shm.Waker()
    inb = shm.Inbound(1, tx, capacity=1 << 16)
    proc = _child(inb, rx, 8)          # 8 MiB into 64 KiB: it blocks with most of it queued
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.poll() is not None else ""
        end = time.monotonic() + 20
        while not inb.ready():
            assert time.monotonic() < end and proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _ours() == []
        assert not inb.producer_closed()        # killed, not closed: the communicator checks the pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        inb.close()
        rx.close()
        tx.close()
    assert _ours() == [] and not os.path.exists(inb.path)


def test_a_ring_nobody_attached_is_removed_when_its_creator_closes():
    tx = shm.poke_socket()
    inb = shm.Inbound(1, tx)
    assert os.path.exists(inb.path) and oct(os.stat(inb.path).st_mode & 0o777) == "0o600"
    inb.close()
    tx.close()
    assert not os.path.exists(inb.path)


def test_host_identity_names_machine_boot_and_user():
    ident = shm.host_identity()
    assert ident == shm.host_identity()
    assert f"uid{os.getuid()}" in ident and ident.count("|") >= 4


def test_the_box_hands_over_tickets_and_is_rewritten_only_when_read_or_abandoned(pair):
    out, inb = pair.out, pair.inb
    x = np.arange(10, dtype=np.float32)
    assert out.box_free(0) and inb.box_ticket(0) == 0
    out.box_put(0, 3, 1234, b'{"op":"allreduce"}', x)
    crc, nbytes, payload = inb.box_get(0, np.dtype(np.float32), 10)
    assert (inb.box_ticket(0), crc, nbytes, inb.box_sig(0)) == (3, 1234, 40, '{"op":"allreduce"}')
    np.testing.assert_array_equal(payload, x)
    assert inb.box_get(0, np.dtype(np.float32), 11)[2] is None       # another size: no payload
    assert not out.box_free(0)                    # not read yet: the producer must wait
    assert out.box_free(0, abandoned=3)           # unless its call 3 failed: nobody will read it
    inb.box_done(0, 3)
    assert out.box_free(0) and out.box_free(1)
    out.box_put(0, 5, 1234, b"{}", x + 1)         # the ticket changes under a reader that held 3
    assert inb.box_ticket(0) == 5 and inb.box_get(0, np.dtype(np.float32), 10)[2][0] == 1.0
