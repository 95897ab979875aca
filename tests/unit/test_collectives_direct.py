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


@pytest.mark.parametrize("algorithm,size", [("ring", 50_000), ("native", 50_000), ("native", 100)],
                         ids=["ring", "native", "native-box"])
def test_a_rank_that_never_calls_is_named_when_the_deadline_passes(group, algorithm, size):
    comms = group(3)

    def body(c):
        if c.rank == 2:
            return "stayed away"
        try:
            C.allreduce(np.ones(size, np.float32), "sum", algorithm, comm=c, timeout=1.0)
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


def _ring_tails(c):
    return {p: ch.tail for p, ch in c._in.items()}


@pytest.mark.parametrize("n", [2, 3])
def test_small_native_allreduces_go_through_the_boxes_for_every_dtype_and_op(group, n):
    comms = group(n)
    run(comms, lambda c: C.barrier(comm=c))
    tails = [_ring_tails(c) for c in comms]
    cases = [(dt, op) for dt in ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
             for op in ("sum", "max", "min", "prod")]
    cases += [("bool", "sum"), ("bool", "prod"), ("float32", "mean"), ("int64", "mean")]
    for rnd in range(2):                                   # every box half used, then reused
        for dt, op in cases:
            xs = [(np.arange(7, dtype=np.int64) % 3 + r + rnd).astype(dt) for r in range(n)]
            got = run(comms, lambda c: C.allreduce(xs[c.rank], op, "native", comm=c, timeout=20))
            if op == "mean":
                total = np.sum(np.stack(xs).astype(np.float64), axis=0)
                want = (total / n).astype(dt) if dt.startswith("float") else np.trunc(total / n).astype(dt)
            else:
                ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
                want = xs[0]
                for x in xs[1:]:
                    want = ufunc(want, x)
            for g in got:
                assert g.dtype == np.dtype(dt)
                np.testing.assert_array_equal(g, want, err_msg=f"{dt} {op}")
    assert [_ring_tails(c) for c in comms] == tails        # not one message went through the rings


def test_box_calls_between_other_calls_on_three_ranks_stay_correct(group):
    comms = group(3)

    def body(c):
        out = []
        for i in range(40):
            x = np.full(5, 10 * i + c.rank, np.float64)
            out.append(C.allreduce(x, "sum", "native", comm=c)[0])
            if i % 3 == 0:   # calls that do not make every rank hear from every other (a ring)
                out.append(C.allreduce(x, "max", "ring", comm=c)[0])
            if i % 7 == 0:
                out.append(C.allreduce(np.ones(70_000, np.float32), "sum", "native", comm=c)[0])
        return out

    got = run(comms, body)
    want = []
    for i in range(40):
        want.append(30.0 * i + 3)
        if i % 3 == 0:
            want.append(10.0 * i + 2)
        if i % 7 == 0:
            want.append(3.0)
    assert got == [want] * 3


def test_a_box_call_against_another_algorithm_is_a_mismatch_at_once(group):
    import time
    comms = group(2)

    def body(c):
        t0 = time.perf_counter()
        try:
            C.allreduce(np.ones(64, np.float32), "sum", ["native", "ring"][c.rank], comm=c, timeout=30)
        except C.CollectiveMismatchError as e:
            return str(e), time.perf_counter() - t0
        return "no error", 0

    for text, took in run(comms, body):
        assert "native" in text and "ring" in text, text
        assert took < 10, took          # not the 30 s deadline: the ring's message names the other call
    t0 = time.perf_counter()
    for _ in range(4):      # both halves of every box again: the unread box of the failed call is no obstacle
        again = run(comms, lambda c: C.allreduce(np.ones(3, np.float32), "sum", "native", comm=c, timeout=10))
        assert all(np.array_equal(a, [2, 2, 2]) for a in again)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("size", [7, 20_001, (1 << 20) + 3], ids=["box", "one-shot", "windows"])
def test_native_allreduce_in_place_and_of_strided_input_on_three_ranks(group, size, monkeypatch):
    comms = group(3)
    if size == 20_001:
        monkeypatch.setattr(shm, "BOX_BYTES", 0)                 # the one-shot messages, not the box
        monkeypatch.setattr(direct, "BOX_BYTES", 0)

    def body(c):
        x = np.arange(size, dtype=np.float64) + c.rank
        inplace = C.allreduce(x, "sum", "native", comm=c, out=x)
        strided = C.allreduce((np.arange(2 * size, dtype=np.float64) * (c.rank + 1))[::2], "sum", "native", comm=c)
        return inplace is x, x, strided

    for same, x, strided in run(comms, body):
        assert same
        np.testing.assert_array_equal(x, 3 * np.arange(size) + 3)
        np.testing.assert_array_equal(strided, 6 * np.arange(0, 2 * size, 2))


@pytest.fixture
def small_shm(monkeypatch, tmp_path):
    """``small_shm(mib)``: shared segments go to a tmpfs of that size (as a container's small
    /dev/shm); needs the right to mount (root), else the test is skipped."""
    import subprocess
    mounted = []

    def make(mib):
        where = tmp_path / f"shm{mib}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=1700", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(where)
        monkeypatch.setattr(shm, "SHM_DIR", str(where))
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_shared_memory_filesystem_is_a_clear_error_not_a_crash(small_shm, group):
    where = small_shm(10)                 # room for the two rings (4 MiB each), not for the windows
    comms = group(2)
    assert all(c.channels == [None, "shm"][::1 if c.rank == 0 else -1] for c in comms)
    x = np.ones(1 << 20, np.float32)     # 4 MiB: each rank wants a window of 8 MiB more

    def body(c):
        try:
            C.allreduce(x, "sum", "native", comm=c, timeout=20)
        except C.CollectiveError as e:
            return str(e)
        return "no error"

    for text in run(comms, body):
        assert "no room" in text and "--shm-size" in text and "could not make its shared window" in text, text
    small = run(comms, lambda c: C.allreduce(np.ones(5, np.float32), "sum", "native", comm=c, timeout=20))
    ring = run(comms, lambda c: C.allreduce(x, "sum", "ring", comm=c, timeout=20))
    assert all(np.all(s == 2) for s in small) and all(np.all(r == 2) for r in ring)
    assert [f for f in os.listdir(where) if "-w" in f] == []     # no window left behind


def test_rings_that_do_not_fit_fall_back_to_zeromq(small_shm, group):
    small_shm(2)                          # not even one ring
    comms = group(2)
    assert [c.channels for c in comms] == [[None, "zmq"], ["zmq", None]]
    got = run(comms, lambda c: C.allreduce(np.arange(1000.0), "sum", "ring", comm=c, timeout=20))
    assert all(np.array_equal(g, 2 * np.arange(1000.0)) for g in got)
