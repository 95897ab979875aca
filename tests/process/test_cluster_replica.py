"""tf.train.replica_device_setter on a real cluster (seeds/004): variables live on the ps task,
the model's other ops run on the worker, and a few steps of gradient descent there give the same
weights as the same steps in a local session."""
import numpy as np
import pytest

import flowlab as fl
import flowlab.compat.v1 as tf

pytestmark = pytest.mark.process


def build(setter=None):
    g = tf.Graph()
    with g.as_default(), tf.device(setter):
        x = tf.placeholder(tf.float32, [None, 3])
        y = tf.placeholder(tf.float32, [None, 1])
        w = tf.Variable(tf.zeros([3, 1]), name="w")
        b = tf.Variable(tf.zeros([1]), name="b")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        step = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.global_variables_initializer()
    return g, x, y, w, b, loss, step, init


def train(sess, x, y, w, b, loss, step, init, data):
    sess.run(init)
    losses = [sess.run([step, loss], feed_dict={x: data[0], y: data[1]})[1] for _ in range(5)]
    return losses, sess.run(w), sess.run(b)


def test_variables_live_on_the_ps_task_and_training_matches_a_local_run():
    rng = np.random.RandomState(0)
    xs = rng.standard_normal((32, 3)).astype(np.float32)
    data = (xs, xs @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3)
    with fl.cluster.LocalCluster(workers=1, ps=1) as cluster:
        setter = tf.train.replica_device_setter(cluster=cluster.spec, worker_device="/job:worker/task:0")
        g, x, y, w, b, loss, step, init = build(setter)
        assert w.device == b.device == "/job:ps/task:0" and loss.device == "/job:worker/task:0"
        cluster.events(clear=True)
        with tf.Session(cluster.target, graph=g) as sess:
            remote = train(sess, x, y, w, b, loss, step, init, data)
        evs = cluster.events()
        ps_ops = {e.name for e in evs if e.kind == "op" and e.task == "/job:ps/task:0"}
        assert any(n.startswith("w") for n in ps_ops) and any("assign" in n or "Assign" in n for n in ps_ops)
        assert any(e.kind == "send" and e.task == "/job:ps/task:0" for e in evs)      # weights to the worker
        assert any(e.kind == "send" and e.task == "/job:worker/task:0" for e in evs)  # gradients to the ps
        held = cluster.call("/job:ps/task:0", _variables_held)
        assert sorted(held) == ["b", "w"]
    g, x, y, w, b, loss, step, init = build()
    with tf.Session(graph=g) as sess:
        local = train(sess, x, y, w, b, loss, step, init, data)
    np.testing.assert_allclose(remote[0], local[0], rtol=1e-6)
    np.testing.assert_allclose(remote[1], local[1], rtol=1e-6)
    np.testing.assert_allclose(remote[2], local[2], rtol=1e-6)
    assert remote[0][-1] < remote[0][0]


def _variables_held():
    import flowlab.cluster as fc
    store = fc.current_server().store
    return [store.get(k)._name for k in store.keys() if k.startswith("var/")]
