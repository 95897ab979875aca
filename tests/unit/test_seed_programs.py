"""The single-process programs of the seed documents (``shared/seeds/``), written for
``flowlab.compat.v1`` and checked against numpy.

Seed 001 (a distributed-TensorFlow hands-on) computes small graphs in a session, then spreads a
mean over slices across the tasks of a ``local`` job. Here the "tasks" are logical CPU devices of
this one process (``/job:localhost``): the graph, the device scopes and the map/reduce are the
same; running them on real worker processes comes with ``fl.cluster.LocalCluster``.

Seed 004 (a talk on distributed TensorFlow) shows variables and ``get_variable``, placeholders
evaluated with ``Tensor.eval``, ops placed on several devices, and data-parallel training: model
replicas compute gradients on their own batches, which are averaged to update shared variables.
"""
from __future__ import annotations

import numpy as np
import pytest

import flowlab as fl
import flowlab.compat.v1 as tf
from flowlab.core.device import RemoteDeviceError

LOCAL = "/job:localhost/replica:0/task:0"


@pytest.fixture(autouse=True)
def three_local_devices():
    """A fresh default graph, and three logical CPUs to stand in for tasks and GPUs."""
    tf.reset_default_graph()
    fl.config.set_logical_devices("CPU", 3)
    yield
    fl.config.set_logical_devices("CPU", None)
    tf.reset_default_graph()


# -- seed 001 ------------------------------------------------------------------------------------------
def test_001_a_constant_and_three_sums():
    two = tf.constant(2)
    plus, minus = two + 300, two - 66
    both = plus + minus
    with tf.Session() as sess:
        assert sess.run(both) == (2 + 300) + (2 - 66) == 238


def test_001_the_same_sums_on_two_devices_of_the_local_job():
    two = tf.constant(2)
    with tf.device(f"{LOCAL}/device:CPU:1"):       # the seed's second task
        minus = two - 66
    with tf.device(f"{LOCAL}/device:CPU:0"):       # the seed's first task, which also combines
        plus = two + 300
        both = plus + minus
    assert minus.op.device.device_index == 1 and both.op.device.device_index == 0
    with tf.Session() as sess:
        assert sess.run(both) == 238


def test_001_the_remote_version_needs_a_cluster():
    two = tf.constant(2)
    with tf.device("/job:local/task:1"):
        minus = two - 66
    with pytest.raises(NotImplementedError, match="LocalCluster"):
        tf.Session("grpc://localhost:2222")
    with tf.Session() as sess, pytest.raises(RemoteDeviceError, match="LocalCluster"):
        sess.run(minus)


def test_001_mean_of_a_fed_vector():
    values = np.random.default_rng(1).random(100)
    x = tf.placeholder(tf.float32, 100)
    mean = tf.reduce_mean(x)
    with tf.Session() as sess:
        np.testing.assert_allclose(sess.run(mean, feed_dict={x: values}), values.mean(), rtol=1e-6)


def test_001_map_reduce_mean_of_two_halves_on_two_devices():
    values = np.random.default_rng(2).random(100)
    x = tf.placeholder(tf.float32, 100)
    with tf.device(f"{LOCAL}/device:CPU:1"):       # map: the first half's mean on one device
        first_mean = tf.reduce_mean(tf.slice(x, [0], [50]))
    with tf.device(f"{LOCAL}/device:CPU:0"):       # map the second half, then reduce, on the other
        second_mean = tf.reduce_mean(tf.slice(x, [50], [-1]))
        mean = (first_mean + second_mean) / 2
    with tf.Session() as sess:
        got = sess.run(mean, feed_dict={x: values})
    np.testing.assert_allclose(got, values.mean(), rtol=1e-6)


def test_001_exercise_weighted_mean_of_unequal_slices():
    """Averaging the slices' means is wrong when the slices differ in size; weighting each mean by
    its slice's size (tf.size) and dividing by the total size is right."""
    values = np.sort(np.random.default_rng(3).random(100))  # sorted: the slices' means differ a lot
    x = tf.placeholder(tf.float32, [100])
    bounds = [(0, 20), (20, 50), (50, -1)]                 # 20, 30 and 50 elements
    sizes, means = [], []
    for task, (begin, end) in enumerate(bounds):
        with tf.device(f"{LOCAL}/device:CPU:{task}"):
            part = tf.slice(x, [begin], [end - begin if end != -1 else -1])
            sizes.append(tf.cast(tf.size(part), tf.float32))
            means.append(tf.reduce_mean(part))
    with tf.device(f"{LOCAL}/device:CPU:0"):
        naive = tf.add_n(means) / len(means)
        weighted = tf.add_n([n * m for n, m in zip(sizes, means)]) / tf.add_n(sizes)
    with tf.Session() as sess:
        got_naive, got_weighted, got_sizes = sess.run([naive, weighted, sizes], feed_dict={x: values})
    assert got_sizes == [20.0, 30.0, 50.0]
    np.testing.assert_allclose(got_weighted, values.mean(), rtol=1e-5)
    assert abs(got_naive - values.mean()) > 0.05


# -- seed 004 -----------------------------------------------------------------------------------------
def test_004_variables_and_get_variable():
    start = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = tf.Variable(start)
    y = tf.get_variable("y", [2, 3], initializer=tf.constant_initializer(0.5))
    z = x + y
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(z), start + 0.5)


def test_004_placeholders_evaluated_in_the_session():
    x = tf.placeholder(tf.float32)                # no shape: a scalar in flowlab
    y = tf.placeholder(tf.float32)
    z = x + y
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())   # nothing to initialize: a no-op
        assert z.eval(feed_dict={x: 1.5, y: 2.25}) == 3.75


def test_004_two_matmuls_on_two_devices_and_their_sum_on_the_cpu(capsys):
    rng = np.random.default_rng(4)
    values = {name: rng.standard_normal((3, 3)).astype(np.float32) for name in "abcd"}
    with tf.device("/cpu:1"):                       # the seed's first GPU
        a, b = tf.placeholder(tf.float32, [3, 3]), tf.placeholder(tf.float32, [3, 3])
        ab = tf.matmul(a, b)
    with tf.device("/cpu:2"):                       # the seed's second GPU
        c, d = tf.placeholder(tf.float32, [3, 3]), tf.placeholder(tf.float32, [3, 3])
        cd = tf.matmul(c, d)
    with tf.device("/cpu:0"):                       # where the two meet
        total = ab + cd
    feed = {a: values["a"], b: values["b"], c: values["c"], d: values["d"]}
    with tf.Session(config=tf.ConfigProto(log_device_placement=True)) as sess:
        got = sess.run(total, feed_dict=feed)
    want = values["a"] @ values["b"] + values["c"] @ values["d"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    log = capsys.readouterr().err
    assert f"{ab.op.name}: (matmul): {LOCAL}/device:CPU:1" in log
    assert f"{cd.op.name}: (matmul): {LOCAL}/device:CPU:2" in log
    assert f"{total.op.name}: (add): {LOCAL}/device:CPU:0" in log


def test_004_data_parallel_linear_model_matches_numpy():
    """Two replicas of a linear model share their variables (kept on CPU:0); each computes the loss
    and gradients of its own batch on its own device; the averaged gradients update the variables."""
    rng = np.random.default_rng(5)
    true_w, true_b = np.array([[1.5], [-2.0]], np.float32), np.float32(0.5)
    batches = [rng.standard_normal((16, 2)).astype(np.float32) for _ in range(2)]
    targets = [x @ true_w + true_b for x in batches]
    lr, steps = 0.1, 200

    def replica(inputs):
        with tf.variable_scope("model", reuse=tf.AUTO_REUSE):
            w = tf.get_variable("w", [2, 1], initializer=tf.zeros_initializer())
            b = tf.get_variable("b", [], initializer=tf.zeros_initializer())
        return tf.matmul(inputs, w) + b, [w, b]

    feeds, grads_per_replica = {}, []
    for i in range(2):
        with tf.device(f"/cpu:{i + 1}"):
            x, y = tf.placeholder(tf.float32, [None, 2]), tf.placeholder(tf.float32, [None, 1])
            prediction, variables = replica(x)
            loss = tf.reduce_mean(tf.square(prediction - y))
            grads_per_replica.append(tf.gradients(loss, variables))
        feeds[x], feeds[y] = batches[i], targets[i]
    with tf.device("/cpu:0"):
        averaged = [tf.add_n(list(gs)) / 2.0 for gs in zip(*grads_per_replica)]
        train = tf.train.GradientDescentOptimizer(lr).apply_gradients(zip(averaged, variables))
    assert len(tf.global_variables()) == 2          # the replicas share one w and one b

    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(steps):
            sess.run(train, feed_dict=feeds)
        got_w, got_b = sess.run(variables)

    w, b = np.zeros((2, 1)), 0.0                    # the same algorithm in numpy, in float64
    for _ in range(steps):
        gw, gb = np.zeros((2, 1)), 0.0
        for x, y in zip(batches, targets):
            err = x @ w + b - y
            gw, gb = gw + 2 * x.T @ err / len(x), gb + 2 * err.mean()
        w, b = w - lr * gw / 2, b - lr * gb / 2
    np.testing.assert_allclose(got_w, w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_b, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_w, true_w, atol=1e-3)
