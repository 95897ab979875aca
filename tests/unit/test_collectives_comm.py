"""The Communicator contract (flowlab/cluster/collectives/comm.py), checked on every transport that
can run in one process. A new transport (the cluster's ZeroMQ adapter) joins by adding a factory
to TRANSPORTS: a function ``n -> (list of n communicators, close function)``."""
import threading

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, PeerGone


def local(n):
    group = LocalGroup(n)
    return list(group), group.close


TRANSPORTS = {"local": local}


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
