"""Remote eager ops and partitioned graphs over the in-process transport: real servers, real
signed messages and the real handlers, in threads (the process tier runs the same on workers)."""
import numpy as np
import pytest

import flowlab as fl
import flowlab.cluster as fc
import flowlab.compat.v1 as tf
from flowlab.cluster import partition, remote
from flowlab.cluster.client import Client
from flowlab.cluster.events import EventLog
from flowlab.cluster.server import Server
from flowlab.core.device import remote_interpreter

KEY = bytes(range(50, 82))


@pytest.fixture
def tasks():
    """Worker 0, worker 1 and ps 0 as inproc servers that know their spec; a client to all three."""
    names = [("worker", 0), ("worker", 1), ("ps", 0)]
    servers = [Server(port=0, job_name=j, task_index=i, key=KEY, transport="inproc", event_log=EventLog())
               for j, i in names]
    spec = fc.ClusterSpec({"worker": [servers[0].address, servers[1].address], "ps": [servers[2].address]})
    client = Client(KEY, transport="inproc", event_log=EventLog())
    for s in servers:
        client.add(s.name, s.address)
    client.request_all([s.name for s in servers], "spec", {"cluster": spec.as_dict()})
    conn = remote.attach(client, [s.name for s in servers], name="inproc")
    try:
        yield servers, client, spec
    finally:
        remote.detach(conn)
        client.close()
        for s in servers:
            s.stop()
        for s in servers:
            assert s.join(5), f"{s.name} did not stop"
    assert remote_interpreter() is None


def kinds(server, kind):
    return [e for e in server.log.events() if e.kind == kind]


def test_remote_ops_equal_local_ones_and_are_logged_on_their_task(tasks):
    (w0, w1, _), _, _ = tasks
    a = fl.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    with fl.device("/job:worker/task:1"):
        h = fl.reduce_sum(fl.matmul(a, fl.transpose(a)) * 0.5, axis=0)
    assert isinstance(h, remote.RemoteTensor) and h.shape == (3,) and h.dtype == fl.float32
    np.testing.assert_array_equal(h.numpy(), fl.reduce_sum(fl.matmul(a, fl.transpose(a)) * 0.5, axis=0).numpy())
    assert [e.name for e in kinds(w1, "op")] == ["transpose", "matmul", "multiply", "reduce_sum"]
    assert kinds(w0, "op") == []
    assert "on /job:worker/task:1" in repr(h)
    assert remote_interpreter() is remote.INTERPRETER           # the interpreter the cluster registered
    with fl.GradientTape() as tape:                        # it shows the tapes what it runs
        tape.watch(a)
        with fl.device("/job:worker/task:1"):
            y = fl.reduce_sum(a * a)
    np.testing.assert_array_equal(tape.gradient(y, a).numpy(), 2 * a.numpy())


def test_a_value_moves_from_task_to_task_without_the_client(tasks):
    (w0, w1, _), client, _ = tasks
    x = fl.constant([1.0, 2.0, 3.0])
    with fl.device("/job:worker/task:0"):
        h0 = x * 2.0
    with fl.device("/job:worker/task:1"):
        h1 = h0 + 1.0
    np.testing.assert_array_equal(h1.numpy(), [3.0, 5.0, 7.0])
    send = [e for e in kinds(w0, "send") if e.attrs["peer"] == "/job:worker/task:1"]
    recv = [e for e in kinds(w1, "recv") if e.attrs["peer"] == "/job:worker/task:0"]
    assert len(send) == 1 and len(recv) == 1 and send[0].bytes == recv[0].bytes == 12


def test_a_handle_cannot_be_used_through_another_cluster(tasks):
    x = fl.constant([1.0])
    with fl.device("/job:worker/task:0"):
        h = x + 1.0
    other = remote.attach(tasks[1], ["/job:worker/task:0"], name="second")
    try:
        with fl.device("/job:worker/task:0"):   # the newest connection has the task now
            with pytest.raises(fl.errors.InvalidArgumentError, match="another cluster"):
                h + 1.0
    finally:
        remote.detach(other)
    assert (h + 1.0).numpy()[0] == 3.0


# -- partitions ---------------------------------------------------------------------------------
def conn(tasks):
    _, client, spec = tasks
    return partition.Connection(client, spec, "/job:worker/task:0", owned=False, monitored=False)


def test_targets_take_the_grpc_spelling_as_an_alias():
    assert partition._normalise_target("grpc://localhost:2222") == "127.0.0.1:2222"
    assert partition._normalise_target("flowlab://127.0.0.1:5") == "127.0.0.1:5"
    with pytest.raises(ValueError, match="grpc://HOST:PORT"):
        partition._normalise_target("http://x:1")
    with pytest.raises(NotImplementedError, match="LocalCluster"):
        tf.Session("grpc://localhost:1")


def test_unplaced_nodes_run_on_the_master_and_unset_fields_come_from_it():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(1.0)
        with tf.device("/job:ps"):
            b = a + 1.0
        with tf.device("/gpu:0"):
            c = b + 1.0
        with tf.device("/job:worker/task:1/cpu:0"):
            d = c + 1.0
    where = [partition.task_of(t.node, "/job:worker/task:0") for t in (a, b, c, d)]
    assert where == [("/job:worker/task:0", "/device:CPU:0"), ("/job:ps/task:0", "/device:CPU:0"),
                     ("/job:worker/task:0", "/device:GPU:0"), ("/job:worker/task:1", "/device:CPU:0")]


def test_a_graph_across_three_tasks_equals_the_local_run(tasks):
    (w0, w1, ps), _, _ = tasks
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, [None])
        with tf.device("/job:worker/task:1"):
            s1 = tf.reduce_sum(x * x)
        with tf.device("/job:ps/task:0"):
            s2 = tf.reduce_max(x) + s1
        total = s1 + s2 + tf.reduce_min(x)
    plan = conn(tasks).plan(g, [total, s1], [x])
    assert set(plan.partitions) == {"/job:worker/task:0", "/job:worker/task:1", "/job:ps/task:0"}
    assert "recv reduce_sum from /job:worker/task:1" in plan.partitions["/job:ps/task:0"]
    data = np.array([1.0, -2.0, 3.0], np.float32)
    got = plan(data)
    s1_ = np.sum(data * data)
    assert [float(v) for v in got] == [float(s1_ + (data.max() + s1_) + data.min()), float(s1_)]
    # each cross-task edge is one send on one side and one receive on the other
    sends = sorted((s.name, e.name, e.attrs["peer"]) for s in (w0, w1, ps) for e in kinds(s, "send"))
    recvs = sorted((e.attrs["peer"], e.name, s.name) for s in (w0, w1, ps) for e in kinds(s, "recv"))
    assert sends == recvs and len(sends) == 3


def test_variables_placed_on_a_task_live_there(tasks):
    (_, _, ps), _, _ = tasks
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:ps/task:0"):
            v = tf.Variable(tf.zeros([2]), name="v")
        step = v.assign_add(tf.constant([1.0, 2.0]))
    assert v.device == "/job:ps/task:0"
    c = conn(tasks)
    c.plan(g, [v.initializer.output], [])()
    for _ in range(3):
        c.plan(g, [step], [])()
    np.testing.assert_array_equal(c.plan(g, [v.value()], [])()[0], [3.0, 6.0])
    held = [k for k in ps.store.keys() if k.startswith("var/")]
    assert len(held) == 1 and ps.store.get(held[0]).numpy().tolist() == [3.0, 6.0]
    assert v._value.tolist() == [0.0, 0.0]      # the client's copy is only a stand-in


def test_replica_device_setter_puts_variables_round_robin_on_ps_tasks_and_they_live_there(tasks):
    (w0, _, ps), _, spec = tasks
    g = tf.Graph()
    with g.as_default():
        with tf.device(tf.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")):
            w = tf.Variable(tf.ones([2]), name="w")
            b = tf.Variable(tf.zeros([2]), name="b")
            x = tf.placeholder(tf.float32, [2])
            y = x * w + b
            train = tf.group(w.assign_add(x), b.assign_sub(x))
    assert (w.device, b.device, y.device) == ("/job:ps/task:0", "/job:ps/task:0", "/job:worker/task:0")
    c = conn(tasks)
    c.plan(g, [w.initializer.output, b.initializer.output], [])()
    feed = np.array([1.0, 2.0], np.float32)
    c.plan(g, list(train.inputs), [x])(feed)
    got = c.plan(g, [y], [x])(feed)[0]
    np.testing.assert_array_equal(got, feed * (1.0 + feed) - feed)
    assert len([k for k in ps.store.keys() if k.startswith("var/")]) == 2
    assert not [k for k in w0.store.keys() if k.startswith("var/")]


def test_replica_device_setter_cycles_over_several_ps_tasks():
    setter = tf.train.replica_device_setter(ps_tasks=2)
    assert tf.train.replica_device_setter(ps_tasks=0) is None
    with tf.Graph().as_default(), tf.device(setter):
        vs = [tf.Variable(tf.zeros([1])) for _ in range(3)]
        op = vs[0] + 1.0
    assert [v.device for v in vs] == ["/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:0"]
    assert op.device == "/job:worker"         # other ops: the worker device
    with pytest.raises(TypeError, match="replica_device_setter"):
        tf.device(lambda op: "/cpu:0")


def test_scalars_stay_scalars_on_the_way_to_a_task_and_back(tasks):
    s, n = fl.constant(6.0), fl.constant(3.0)
    with fl.device("/job:worker/task:1"):
        h = s / n
    assert h.shape == () and h.numpy() == 2.0
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, [])
        with tf.device("/job:worker/task:1"):
            y = x * 2.0
    got = conn(tasks).plan(g, [y], [x])(np.float32(4.0))[0]
    assert got.shape == () and got == 8.0


def test_fetching_only_fed_values_needs_no_task_and_a_session_lists_no_partitions_locally(tasks):
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, [2])
    plan = conn(tasks).plan(g, [x], [x])
    assert plan.partitions == {}
    assert plan(np.array([1.0, 2.0], np.float32))[0].tolist() == [1.0, 2.0]
    with tf.Session(graph=g) as sess:
        assert sess.partitions(x, {x: [1.0, 2.0]}) == {}
