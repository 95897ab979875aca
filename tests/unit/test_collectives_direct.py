"""algorithm="native" on the cluster transport when all ranks share a host: the shared-memory
collectives of flowlab/cluster/collectives/direct.py, with the communicators of Servers in this
process (real sockets on 127.0.0.1, real shared memory), one thread per rank."""
import os
import threading

import numpy as np
import pytest

from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import direct, shm

pytestmark = pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))


@pytest.fixture
def group(request):
    from flowlab.cluster.collectives.zmq import ZmqCommunicator
    from flowlab.cluster.protocol import new_key
    from flowlab.cluster.server import Server
    from flowlab.cluster.spec import ClusterSpec

    made = []

    def make(n, **options):
        key = new_key()
        servers = [Server(None, "worker", r, key=key, port=0) for r in range(n)]
        spec = ClusterSpec({"worker": [s.address for s in servers]})
        for s in servers:
            s.spec = spec
        comms = [None] * n

        def one(r):
            comms[r] = ZmqCommunicator(servers[r], peer_timeout=2.0, connect_timeout=20.0, **options)

        threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        made.append((comms, servers))
        assert None not in comms
        return comms

    yield make
    for comms, servers in made:
        for c in comms:
            if c is not None:
                c.close()
        for s in servers:
            s.stop()


def run(comms, fn):
    """fn(comm) on every rank at once, in threads; the results in rank order (errors re-raised)."""
    out, errors = [None] * len(comms), []

    def one(c):
        try:
            out[c.rank] = fn(c)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("size", [5, 20_001, (3 << 20) + 7], ids=["tiny", "one-shot", "windows"])
def test_native_allreduce_equals_the_sum_and_is_bitwise_equal_on_every_rank(group, n, size):
    comms = group(n)
    assert all(isinstance(c.native, direct.SharedMemoryCollectives) for c in comms)
    rng = np.random.default_rng(size)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    for _ in range(3):       # the windows' two halves taken by turns, then reused
        got = run(comms, lambda c: C.allreduce(xs[c.rank], "sum", "native", comm=c, timeout=30))
        np.testing.assert_allclose(got[0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
        assert all(np.array_equal(g, got[0]) for g in got)
    means = run(comms, lambda c: C.allreduce(np.full((2, 3), c.rank, np.int64), "max", "native", comm=c))
    assert all(np.array_equal(m, np.full((2, 3), n - 1)) for m in means)


def test_native_reduce_scatter_allgather_broadcast_barrier(group):
    comms = group(3)
    x = np.arange(3 * 400_000, dtype=np.float64).reshape(3 * 400_000 // 4, 4)

    def body(c):
        rs = C.reduce_scatter(x * (c.rank + 1), "sum", "native", comm=c)
        ag = C.allgather(np.full((2, 2), c.rank, np.int32), "native", comm=c)
        bc = C.broadcast(np.arange(10.0) * c.rank, root=2, algorithm="native", comm=c)
        C.barrier("native", comm=c)
        return rs, ag, bc

    out = run(comms, body)
    whole = x * 6
    for r, (rs, ag, bc) in enumerate(out):
        np.testing.assert_array_equal(rs, np.array_split(whole, 3)[r])
        np.testing.assert_array_equal(ag, np.repeat(np.arange(3), 2)[:, None] * np.ones((6, 2), np.int32))
        np.testing.assert_array_equal(bc, np.arange(10.0) * 2)


def test_windows_grow_and_leave_nothing_in_dev_shm(group):
    comms = group(2)
    for size in (1000, 1 << 20, 3 << 20, 1 << 20):
        got = run(comms, lambda c: C.allreduce(np.ones(size, np.float32), "sum", "native", comm=c))
        assert all(np.all(g == 2) for g in got)
    assert [f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"flowlab-{os.getpid()}-")] == []


def test_native_needs_every_peer_on_shared_memory(group):
    comms = group(2, shm=False)
    assert comms[0].native is None
    with pytest.raises(ValueError, match="native"):
        C.allreduce(np.ones(3), algorithm="native", comm=comms[0])


def test_a_mismatch_under_native_is_named_on_every_rank(group):
    comms = group(2)

    def body(c):
        try:
            C.allreduce(np.ones(100 + c.rank, np.float32), "sum", "native", comm=c, timeout=10)
        except C.CollectiveMismatchError as e:
            return str(e)
        return "no error"

    for text in run(comms, body):
        assert "float32[100]" in text and "float32[101]" in text, text


@pytest.mark.parametrize("algorithm", ["ring", "native"])
def test_a_rank_that_never_calls_is_named_when_the_deadline_passes(group, algorithm):
    comms = group(3)

    def body(c):
        if c.rank == 2:
            return "stayed away"
        try:
            C.allreduce(np.ones(50_000, np.float32), "sum", algorithm, comm=c, timeout=1.0)
        except C.CollectiveTimeoutError as e:
            return e.missing
        return "finished"

    assert run(comms, body) == [[2], [2], "stayed away"]


def test_close_releases_threads_rings_and_sockets(group):
    comms = group(2)
    big = np.ones(9 << 20, np.uint8)         # more than a ring: the Pusher thread starts
    comms[0].send(1, {}, [big])
    assert comms[0]._pusher._started
    assert comms[1].recv(20)[2][0].size == big.size
    run(comms, lambda c: C.allreduce(np.ones(1 << 20, np.float32), "sum", "native", comm=c))
    for c in comms:
        c.close()
    for c in comms:
        with pytest.raises(C.PeerGone):
            c.recv(0.1)
        assert c._rx.sock.fileno() == -1 and all(ch._map is None for ch in [*c._in.values(), *c._out.values()])
    assert [t.name for t in threading.enumerate() if t.name.startswith("flowlab-shm-push")] == []
    assert [f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"flowlab-{os.getpid()}-")] == []


def test_flush_gives_up_on_a_peer_that_does_not_read_and_the_pusher_delivers_later(group):
    import time

    a, b = group(2)
    a.send(1, {"big": True}, [np.ones(9 << 20, np.uint8)])      # more than the ring holds
    t0 = time.perf_counter()
    a.flush(time.perf_counter() + 30)                            # b reads nothing meanwhile
    assert time.perf_counter() - t0 < 5
    src, header, (got,) = b.recv(20)                             # a is elsewhere: its Pusher moves it
    assert (src, header, got.size) == (0, {"big": True}, 9 << 20) and got.all()


def test_ranks_that_made_different_native_calls_get_errors_then_agree_again(group):
    a, b = group(2)
    x = np.ones(1 << 18, np.float32)                     # 1 MiB: the windows are used

    def call(algs):
        def body(c):
            try:
                return C.allreduce(x, "sum", algs[c.rank], comm=c, timeout=10)
            except C.CollectiveMismatchError as e:
                return str(e)
        return run([a, b], body)

    first = call(["native", "ring"])                     # rank 0 counts a native call, rank 1 not
    assert all(isinstance(t, str) and "native" in t and "ring" in t for t in first), first
    second = call(["native", "native"])                  # the counts differ: named, never a wrong half
    assert all(isinstance(t, str) and "native call #" in t for t in second), second
    third = call(["native", "native"])                   # both took the larger count
    assert all(np.array_equal(t, 2 * x) for t in third)
