"""Group formation of the cluster's communicator (flowlab/cluster/collectives/zmq.py) waits by the
caller's deadline and heeds death notices (collectives/_gone.py), between real Servers of this
process on 127.0.0.1: a lazily made communicator forms its group inside the first collective."""
import threading
import time

import numpy as np
import pytest

from flowlab.cluster.collectives import CollectiveTimeoutError, PeerLostError, allreduce
from flowlab.cluster.collectives._gone import MSG_TYPE, Teller, known
from flowlab.cluster.liveness import Monitor
from flowlab.cluster.protocol import new_key
from flowlab.cluster.server import Server
from flowlab.cluster.spec import ClusterSpec
from flowlab.cluster.transport import ZmqTransport


@pytest.fixture
def pair():
    """Two Servers of one job; only rank 0 gets a communicator (made lazily: not formed)."""
    from flowlab.cluster.collectives.zmq import ZmqCommunicator

    key = new_key()
    servers = [Server(None, "worker", r, key=key, port=0) for r in range(2)]
    spec = ClusterSpec({"worker": [s.address for s in servers]})
    for s in servers:
        s.spec = spec
    comm = ZmqCommunicator(servers[0], connect_timeout=None, shm=False)
    yield key, servers, comm
    comm.close()
    for s in servers:
        s.stop()
        s.join(5)


def test_a_lazy_communicator_is_not_formed_until_a_collective_needs_it(pair):
    _, _, comm = pair
    assert comm.formed is False and comm.size == 2 and comm.rank == 0


def test_forming_waits_by_the_callers_deadline_and_names_the_rank(pair):
    _, servers, comm = pair
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        allreduce(np.ones(3), comm=comm, timeout=1.0)
    took = time.monotonic() - start
    err = info.value
    assert isinstance(err, TimeoutError) and 0.9 < took < 3.0, took
    assert err.op == "allreduce" and err.missing == [1] and err.rank == 0 and err.waited >= 1.0
    assert "allreduce #1 on rank 0 timed out after" in str(err) and "/job:worker/task:1" in str(err)
    assert "has not called a collective" in str(err)     # its server answered; it has no communicator
    # rank 1 comes late: the next collective goes on forming the group, and sums
    from flowlab.cluster.collectives.zmq import ZmqCommunicator
    late, got = [], []

    def rank_1():
        late.append(ZmqCommunicator(servers[1], connect_timeout=10, shm=False))
        got.append(allreduce(np.ones(3), comm=late[0], timeout=10))
    t = threading.Thread(target=rank_1)
    t.start()
    try:
        assert allreduce(np.ones(3), comm=comm, timeout=10).tolist() == [2.0] * 3
    finally:
        t.join(15)
        for c in late:
            c.close()
    assert comm.formed and got[0].tolist() == [2.0] * 3


def _tell(key, server, body):
    """Send ``server`` a signed death notice as a LocalCluster's monitor does (its Teller)."""
    monitor = Monitor(ZmqTransport(), key)
    try:
        state = monitor.watch(body["task"])
        state.pid, state.exitcode = body["pid"], body["exitcode"]
        me = monitor.watch("/job:worker/task:0")
        me.address, me.server_id, me.status = server.address, server.id, "alive"
        monitor.restart_hint = lambda task: "cluster.restart(1)"
        teller = Teller(ZmqTransport(), key)
        teller(monitor, state)
        end = time.monotonic() + 5
        while known(server, body["task"]) is None:
            assert time.monotonic() < end, "the notice never arrived"
            time.sleep(0.01)
        teller.close()
    finally:
        monitor.close()


def test_a_peer_reported_dead_fails_the_collective_at_once(pair):
    key, servers, comm = pair
    _tell(key, servers[0], {"task": "/job:worker/task:1", "pid": 4242, "exitcode": -9})
    start = time.monotonic()
    with pytest.raises(PeerLostError) as info:
        allreduce(np.ones(3), comm=comm, timeout=30.0)
    assert time.monotonic() - start < 1.0
    text = str(info.value)
    assert info.value.missing == [1] and info.value.op == "allreduce"
    for part in ("rank 1", "/job:worker/task:1", "pid 4242", "killed by signal 9 (SIGKILL)", "cluster.restart(1)"):
        assert part in text, (part, text)


def test_a_new_cluster_spec_voids_older_notices(pair):
    key, servers, _ = pair
    _tell(key, servers[0], {"task": "/job:worker/task:1", "pid": 4242, "exitcode": 3})
    assert "exit code 3" in known(servers[0], "/job:worker/task:1")
    servers[0].spec = ClusterSpec(servers[0].spec.as_dict())    # as cluster.restart(1) sends one
    assert known(servers[0], "/job:worker/task:1") is None


def test_the_notice_type_is_served_by_every_server(pair):
    _, servers, _ = pair
    assert MSG_TYPE in servers[1]._handlers
