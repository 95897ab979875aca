"""The Communicator contract (flowlab/cluster/collectives/comm.py), checked on every transport that
can run in one process: LocalGroup, and the cluster's transport between Servers of this process
over shared memory (``shm``), over ZeroMQ only (``zmq``) and both at once (``mixed``, two pretend
hosts). A new transport joins by adding a factory to TRANSPORTS: a function
``n -> (list of n communicators, close function)``."""
import threading

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, PeerGone


def local(n):
    group = LocalGroup(n)
    return list(group), group.close


def _cluster_comms(n, options):
    """``n`` ZmqCommunicators of ``n`` Servers in this process (real sockets on 127.0.0.1, real
    shared memory); ``options(r)`` gives rank r's keyword arguments."""
    from flowlab.cluster.protocol import new_key
    from flowlab.cluster.server import Server
    from flowlab.cluster.spec import ClusterSpec
    from flowlab.cluster.collectives.zmq import ZmqCommunicator

    key = new_key()
    servers = [Server(None, "worker", r, key=key, port=0) for r in range(n)]
    spec = ClusterSpec({"worker": [s.address for s in servers]})
    for s in servers:
        s.spec = spec
    comms, errors = [None] * n, []

    def make(r):
        try:
            comms[r] = ZmqCommunicator(servers[r], peer_timeout=2.0, connect_timeout=20.0,
                                       **options(r))
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    def close():
        for c in comms:
            if c is not None:
                c.close()
        for s in servers:
            s.stop()
            s.join(5)

    if errors or None in comms:
        close()
        raise errors[0] if errors else TimeoutError("communicators did not form")
    return comms, close


def shm(n):
    comms, close = _cluster_comms(n, lambda r: {})
    assert all(c.channels[p] == "shm" for c in comms for p in range(n) if p != c.rank), comms
    return comms, close


def zmq(n):
    comms, close = _cluster_comms(n, lambda r: {"shm": False})
    assert all(c.channels[p] == "zmq" for c in comms for p in range(n) if p != c.rank), comms
    return comms, close


def mixed(n):
    """Two pretend hosts: even ranks share memory, odd ranks share memory, the rest use ZeroMQ."""
    comms, close = _cluster_comms(n, lambda r: {"host": f"host{r % 2}"})
    assert all(c.channels[p] == ("shm" if (p - c.rank) % 2 == 0 else "zmq")
               for c in comms for p in range(n) if p != c.rank), comms
    return comms, close


TRANSPORTS = {"local": local, "shm": shm, "zmq": zmq, "mixed": mixed}


@pytest.fixture(params=sorted(TRANSPORTS))
def make(request):
    made = []

    def factory(n):
        comms, close = TRANSPORTS[request.param](n)
        made.append(close)
        return comms

    yield factory
    for close in made:
        close()


def test_rank_and_size(make):
    comms = make(3)
    assert [(c.rank, c.size) for c in comms] == [(0, 3), (1, 3), (2, 3)]


def test_messages_from_one_sender_arrive_in_order_with_header_dtype_and_shape(make):
    a, b = make(2)
    dtypes = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]
    for i, dt in enumerate(dtypes):
        a.send(1, {"i": i, "tag": [dt, None, 1.5, True], "d": {"k": "v"}},
               [np.arange(6).reshape(2, 3).astype(dt), np.zeros(0, dt)])
    a.send(1, {"empty": True}, [])
    for i, dt in enumerate(dtypes):
        src, header, arrays = b.recv(5)
        assert src == 0 and header == {"i": i, "tag": [dt, None, 1.5, True], "d": {"k": "v"}}
        assert [x.dtype for x in arrays] == [np.dtype(dt)] * 2 and arrays[0].shape == (2, 3)
        assert np.array_equal(arrays[0], np.arange(6).reshape(2, 3).astype(dt)) and arrays[1].size == 0
        assert arrays[0].flags.c_contiguous
    assert b.recv(5) == (0, {"empty": True}, [])


def test_the_sender_may_overwrite_its_buffer_once_send_returns(make):
    a, b = make(2)
    buf = np.ones(1000)
    a.send(1, {}, [buf])
    buf[:] = -1                      # what the ring does with a chunk it has passed on
    _, _, (got,) = b.recv(5)
    assert np.all(got == 1)


def test_recv_takes_from_any_sender(make):
    a, b, c = make(3)
    b.send(0, {"from": 1}, [])
    c.send(0, {"from": 2}, [])
    got = sorted((src, h["from"]) for src, h, _ in (a.recv(5), a.recv(5)))
    assert got == [(1, 1), (2, 2)]


def test_send_never_waits_for_the_receiver(make):
    a, b = make(2)
    big = np.ones(4 << 20, np.uint8)
    done = threading.Event()

    def sender():
        for _ in range(4):
            a.send(1, {}, [big])     # nobody is receiving yet
        done.set()

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    t.join(30)
    assert done.is_set()
    assert all(b.recv(5)[2][0].size == big.size for _ in range(4))


def test_recv_times_out_with_timeouterror(make):
    a, _ = make(2)
    with pytest.raises(TimeoutError):
        a.recv(0.05)


def test_a_lost_peer_is_reported_once_after_its_messages(make, request):
    if request.node.callspec.params["make"] != "local":
        pytest.skip("needs a way to kill a rank: add one for this transport")
    group = LocalGroup(3)
    try:
        group[2].send(0, {"last words": True}, [])
        group.kill(2)
        assert group[0].recv(5)[1] == {"last words": True}    # delivered first
        with pytest.raises(PeerGone) as e:
            group[0].recv(5)
        assert e.value.peers == [2] and "killed" in e.value.reason
        group[1].send(0, {"still": "here"}, [])
        assert group[0].recv(5)[1] == {"still": "here"}       # reported once; the others go on
        with pytest.raises(PeerGone) as e:
            group[2].recv(1)                                   # the dead rank itself cannot go on
        assert e.value.peers == [2]
    finally:
        group.close()


def test_large_messages_both_ways_at_once_do_not_deadlock(make):
    """Each rank sends more than a shared-memory ring holds before either receives (what a
    naive allreduce does): sends return, and everything arrives intact."""
    a, b = make(2)
    big = [np.arange(9 << 20, dtype=np.uint8) + i for i in range(2)]     # 9 MiB each, > the ring
    done = []

    def side(comm, mine):
        comm.send(1 - comm.rank, {"from": comm.rank}, [mine])
        src, header, (got,) = comm.recv(30)
        done.append((comm.rank, src, header["from"], np.array_equal(got, big[src])))

    threads = [threading.Thread(target=side, args=(c, big[c.rank]), daemon=True) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(done) == [(0, 1, 1, True), (1, 0, 0, True)]


def test_messages_of_every_size_keep_their_order(make):
    a, b = make(2)
    rng = np.random.default_rng(0)
    sizes = [0, 1, 7, 4096, 65_000, 70_000, 1 << 20, 3, (5 << 20) + 5, 12, 2 << 20]
    sent = [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]
    for i, x in enumerate(sent):
        a.send(1, {"i": i}, [x, x[:5].astype(np.float64)])
    for i, x in enumerate(sent):
        src, header, (got, head) = b.recv(30)
        assert (src, header) == (0, {"i": i})
        assert np.array_equal(got, x) and np.array_equal(head, x[:5].astype(np.float64))
