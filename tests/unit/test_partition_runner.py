"""A task runs its partition as a core Graph through core's executor: send/recv are graph nodes of
table ops, the compiled partition is kept while the client sends the same one, and its variables
are checked again before every run (inproc servers, real handlers)."""
import numpy as np
import pytest

import flowlab.compat.v1 as tf
from flowlab.cluster import partition, sendrecv, task_exec

KEY = bytes(range(90, 122))


@pytest.fixture
def conn(inproc_cluster):
    servers, client, spec = inproc_cluster
    return partition.Connection(client, spec, "/job:worker/task:0", owned=False, monitored=False), servers


def test_a_partition_is_a_compiled_graph_with_send_and_recv_nodes_kept_between_runs(conn):
    c, (w0, w1) = conn
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder(tf.float32, [None])
        with tf.device("/job:worker/task:1"):
            y = x * 2.0
        with tf.device("/job:worker/task:0"):
            z = tf.reduce_sum(y) + 1.0
    plan = c.plan(g, [z], [x])
    for k in range(3):
        assert plan(np.array([1.0, 2.0, 3.0 + k], np.float32))[0] == 13.0 + 2 * k
    (p1,), (p0,) = [s.state(task_exec.__name__)["plans"].values() for s in (w1, w0)]   # compiled once each
    assert [n.op for n in p1.plan.nodes][-1] is sendrecv.SEND
    assert sendrecv.RECV in [n.op for n in p0.plan.nodes] and p0.plan.graph.name == "partition of /job:worker/task:0"
    assert len([e for e in w1.log.events() if e.kind == "op" and e.name == y.op.name]) == 3


def test_a_kept_partition_sees_a_shared_variable_replaced_by_another_initializer(conn):
    c, (_, w1) = conn

    def graph(shape):
        g = tf.Graph()
        with g.as_default():
            with tf.device("/job:worker/task:1"):
                v = tf.Variable(tf.ones(shape), name="v")
                total = tf.reduce_sum(v)
        return g, v, total

    g, v, total = graph([2])
    run = c.plan(g, [total], [])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"node .*ReadVariableOp|uninitialized value v"):
        run()
    c.plan(g, [v.initializer.output], [])()
    assert run()[0] == 2.0
    g3, v3, _ = graph([3])                        # another client's v, of another shape, replaces it
    c.plan(g3, [v3.initializer.output], [])()
    with pytest.raises(tf.errors.InvalidArgumentError, match="another shape"):
        run()
