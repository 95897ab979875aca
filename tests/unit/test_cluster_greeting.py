"""A pair of ranks on one host never ends up on ZeroMQ because of an old greeting's answer.

A rank that gave up forming its group (its deadline passed) leaves its ``coll-hi`` unanswered on
the connection; if the peer's communicator is then replaced (a restart elsewhere closes it), the
next greeting used to read that old answer, which names a ring the closed communicator made: the
pair fell back to ZeroMQ (or wrote into a ring nobody reads) and ``algorithm="native"`` was refused
with a bare ValueError (found by the soak, tests/process/test_soak.py, seed 44444). Each greeting
now carries a number its answer echoes; and ``native`` on a group with a ZeroMQ pair raises a
collective error naming the peer and why.
"""
import os
import threading
import time

import numpy as np
import pytest

from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import shm
from flowlab.cluster.collectives.errors import CollectiveError

pytestmark = pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))


@pytest.fixture
def servers():
    from flowlab.cluster.protocol import new_key
    from flowlab.cluster.server import Server
    from flowlab.cluster.spec import ClusterSpec

    key = new_key()
    made = [Server(None, "worker", r, key=key, port=0) for r in range(2)]
    spec = ClusterSpec({"worker": [s.address for s in made]})
    for s in made:
        s.spec = spec
    yield made
    for s in made:
        s.stop()


def _form_both(a, b):
    errors = []

    def one(c):
        try:
            c.form(20.0)
        except Exception as e:  # noqa: BLE001 - shown below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(c,)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_an_old_greetings_answer_is_not_taken_for_a_new_one(servers):
    from flowlab.cluster.collectives.zmq import HELLO_TYPE, ZmqCommunicator

    a = ZmqCommunicator(servers[0], peer_timeout=2.0, connect_timeout=None)
    old = ZmqCommunicator(servers[1], peer_timeout=2.0, connect_timeout=None)
    comms = [a, old]
    try:
        # rank 0 greets rank 1, then gives up before reading the answer (its deadline passed)
        conn = a._conns[1] = servers[0].transport.connect(a.addresses[1])
        conn.send(a._signer.pack("hello", "*", {}))
        frames = conn.recv(10)
        a._ids[1] = a._verifier.unpack(frames).body["id"]
        conn.send(a._signer.pack(HELLO_TYPE, a._ids[1], {"src": 0, "comm": a.id, "host": a.host,
                                                        "pid": os.getpid(), "tx": a._rx.name, "n": "given-up"}))
        end = time.monotonic() + 10
        while 0 not in old._in and time.monotonic() < end:    # rank 1 answered (the answer waits, unread)
            time.sleep(0.01)
        assert 0 in old._in
        time.sleep(0.2)
        # rank 1's communicator is replaced (as a restart elsewhere does), then both form the group
        old.close()
        b = ZmqCommunicator(servers[1], peer_timeout=2.0, connect_timeout=None)
        comms.append(b)
        _form_both(a, b)
        assert a.channels == [None, "shm"] and b.channels == ["shm", None], (a, b)
        got = [None, None]

        def reduce(r, c):
            got[r] = C.allreduce(np.full(4, r + 1.0), algorithm="native", comm=c, timeout=10)
        threads = [threading.Thread(target=reduce, args=(r, c)) for r, c in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(g is not None and np.all(g == 3.0) for g in got), got
    finally:
        for c in comms:
            c.close()


def test_native_on_a_group_with_a_zeromq_pair_names_the_peer_and_why(servers):
    from flowlab.cluster.collectives.zmq import ZmqCommunicator

    a = ZmqCommunicator(servers[0], peer_timeout=2.0, connect_timeout=None, host="elsewhere")
    b = ZmqCommunicator(servers[1], peer_timeout=2.0, connect_timeout=None)
    try:
        _form_both(a, b)
        with pytest.raises(CollectiveError, match=r"rank 1 \(/job:worker/task:1\): .*another host") as info:
            C.allreduce(np.ones(3), algorithm="native", comm=a, timeout=5)
        assert isinstance(info.value, ValueError) and info.value.missing == [1]
        assert "'ring'" in str(info.value)
    finally:
        a.close()
        b.close()
