"""tf.placeholder(dtype) without a shape has unknown rank, as in TF1: the graph builds, shapes
propagate as unknown (or as much as the ops can tell), the session takes any fed shape, and
gradients and training steps use the shapes the values have when the graph runs."""
import pickle

import numpy as np
import pytest

import flowlab as fl
import flowlab.compat.v1 as tf
from flowlab.core.shape import TensorShape


# -- TensorShape(None) ------------------------------------------------------------------------------
def test_unknown_rank_shape_behaves_as_tensorflows():
    s = TensorShape(None)
    assert s.rank is None and str(s) == "<unknown>" and repr(s) == "TensorShape(None)"
    assert s.num_elements() is None and not s.is_fully_defined()
    assert s.is_compatible_with([2, 3]) and TensorShape([2, 3]).is_compatible_with(s)
    assert s == TensorShape(None) and s != TensorShape([]) and TensorShape([]) != s and s != ()
    assert TensorShape(s) is s and pickle.loads(pickle.dumps(s)) == s
    for what in (s.as_list, lambda: len(s), lambda: list(s)):
        with pytest.raises(ValueError, match="unknown rank"):
            what()


def test_placeholder_without_a_shape_has_unknown_rank_and_with_one_keeps_it():
    with tf.Graph().as_default():
        a = tf.placeholder(tf.float32, name="a")
        b = tf.placeholder(tf.float32, shape=None, name="b")
        c = tf.placeholder(tf.float32, [None, 3], name="c")
        d = tf.placeholder(tf.float32, [], name="d")
    assert a.shape.rank is None and b.shape.rank is None and a.ndim is None
    assert c.shape.as_list() == [None, 3] and d.shape.rank == 0
    assert "shape=<unknown>" in repr(a)


# -- building: shapes propagate ---------------------------------------------------------------------
def test_ops_on_unknown_rank_give_unknown_or_what_can_be_known():
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32)
        w = tf.placeholder(tf.float32, [3, 2])
        assert (x * 2.0 + 1.0).shape.rank is None
        assert (x + tf.ones([3])).shape.rank is None
        assert tf.matmul(x, w).shape.rank is None        # flowlab's matmul broadcasts batch axes
        assert tf.reduce_sum(x).shape == () and tf.size(x).shape == ()
        assert tf.reduce_mean(x, keepdims=True).shape.rank is None
        assert tf.reduce_sum(x, axis=-1).shape.rank is None
        assert tf.shape(x).shape.as_list() == [None]
        assert tf.reshape(x, [-1, 4]).shape.as_list() == [None, 4]
        assert tf.cast(x, tf.int32).dtype == tf.int32 and (x > 0.0).dtype == tf.bool
        assert tf.transpose(x, [1, 0, 2]).shape.as_list() == [None, None, None]
        assert tf.transpose(x).shape.rank is None


def test_transpose_without_perm_reverses_the_axes_it_is_fed():
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, name="x")
        w = tf.placeholder(tf.float32, [2, 3], name="w")
        y = tf.matmul(w, tf.transpose(x))
        (dx,) = tf.gradients(tf.reduce_sum(y * y), [x])
        with tf.Session() as sess:
            X, W = np.arange(12.0).reshape(4, 3) / 10, np.linspace(-1, 1, 6).reshape(2, 3)
            out, grad = sess.run([y, dx], {x: X, w: W})
            assert np.allclose(out, W @ X.T) and np.allclose(grad, (2 * (W @ X.T)).T @ W, rtol=1e-5)
            assert sess.run(tf.transpose(x), {x: np.ones((2, 3, 4))}).shape == (4, 3, 2)


def test_errors_that_do_not_depend_on_the_rank_still_come_while_building():
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, name="x")
        k = tf.placeholder(tf.int32, name="k")
        with pytest.raises(tf.errors.InvalidArgumentError, match="same dtype"):
            x + k
        with pytest.raises(tf.errors.InvalidArgumentError, match="floating-point"):
            tf.sqrt(k)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"rank 2 or more.*x:0: unknown rank"):
            tf.matmul(x, tf.ones([3]))


# -- feeding ---------------------------------------------------------------------------------------
def test_one_placeholder_fed_different_ranks_on_different_runs():
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, name="x")
        y = tf.exp(x * 0.5) - 1.0 + x * x
        (dx,) = tf.gradients(tf.reduce_sum(y), [x])
        with tf.Session() as sess:
            for value in (1.5, [1.0, -2.0], np.arange(6.0).reshape(2, 3) / 4, np.ones((2, 1, 2))):
                v = np.asarray(value, np.float32)
                out, grad = sess.run([y, dx], {x: value})
                assert out.shape == v.shape and np.allclose(out, np.exp(v * 0.5) - 1 + v * v, rtol=1e-6)
                assert grad.shape == v.shape and np.allclose(grad, 0.5 * np.exp(v * 0.5) + 2 * v, rtol=1e-6)


def test_a_known_shape_still_refuses_a_mismatching_feed():
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, 3], name="x")
        y = tf.reduce_sum(x)
        with tf.Session() as sess:
            with pytest.raises(ValueError, match=r"shape \(2, 2\) to x:0, which has shape \[None, 3\]"):
                sess.run(y, {x: np.ones((2, 2))})


# -- the tutorial programs --------------------------------------------------------------------------
def _data():
    rng = np.random.default_rng(7)
    xs = np.linspace(0.0, 2.0, 11).astype(np.float32)
    ys = (0.8 * xs - 0.3 + rng.normal(0.0, 0.05, xs.size)).astype(np.float32)
    return xs, ys


def _linear_regression(n, rate):
    X = tf.placeholder(tf.float32)
    Y = tf.placeholder(tf.float32)
    W = tf.Variable(0.25, name="weight")
    b = tf.Variable(-0.5, name="bias")
    pred = tf.add(tf.multiply(X, W), b)
    cost = tf.reduce_sum(tf.pow(pred - Y, 2)) / (2 * n)
    optimizer = tf.train.GradientDescentOptimizer(rate).minimize(cost)
    return X, Y, W, b, cost, optimizer


def _numpy_step(w, b, x, y, n, rate):
    err = x * w + b - y
    return w - rate * np.sum(err * x) / n, b - rate * np.sum(err) / n


def test_classic_linear_regression_fed_one_scalar_per_step():
    xs, ys = _data()
    n, rate = xs.size, 0.2
    with tf.Graph().as_default():
        X, Y, W, b, cost, optimizer = _linear_regression(n, rate)
        assert cost.shape == ()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            w_np, b_np = 0.25, -0.5
            for _ in range(20):
                for x, y in zip(xs, ys):
                    sess.run(optimizer, feed_dict={X: x, Y: y})
                    w_np, b_np = _numpy_step(w_np, b_np, np.float64(x), np.float64(y), n, rate)
            w, bias, c = sess.run([W, b, cost], feed_dict={X: xs, Y: ys})
    assert np.isclose(w, w_np, rtol=1e-4) and np.isclose(bias, b_np, rtol=1e-4, atol=1e-5)
    assert abs(w - 0.8) < 0.1 and abs(bias + 0.3) < 0.1 and c < 0.01


def test_classic_linear_regression_fed_whole_arrays():
    xs, ys = _data()
    n, rate = xs.size, 0.3
    with tf.Graph().as_default():
        X, Y, W, b, cost, optimizer = _linear_regression(n, rate)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            w_np, b_np = 0.25, -0.5
            for _ in range(30):
                sess.run(optimizer, feed_dict={X: xs, Y: ys})
                w_np, b_np = _numpy_step(w_np, b_np, xs.astype(np.float64), ys.astype(np.float64), n, rate)
            w, bias = sess.run([W, b])
    assert np.isclose(w, w_np, rtol=1e-4) and np.isclose(bias, b_np, rtol=1e-4, atol=1e-5)


def test_matmul_of_two_shapeless_placeholders_fed_matrices():
    rng = np.random.default_rng(3)
    with tf.Graph().as_default():
        a = tf.placeholder(tf.float32, name="a")
        b = tf.placeholder(tf.float32, name="b")
        product = tf.matmul(a, b)
        da, db = tf.gradients(tf.reduce_sum(tf.square(product)), [a, b])
        with tf.Session() as sess:
            for m, k, n in ((2, 3, 4), (5, 1, 2)):
                A = rng.normal(size=(m, k)).astype(np.float32)
                B = rng.normal(size=(k, n)).astype(np.float32)
                out, ga, gb = sess.run([product, da, db], {a: A, b: B})
                assert np.allclose(out, A @ B, rtol=1e-5, atol=1e-6)
                assert np.allclose(ga, 2 * (A @ B) @ B.T, rtol=1e-4, atol=1e-5)
                assert np.allclose(gb, A.T @ (2 * (A @ B)), rtol=1e-4, atol=1e-5)


def _central_differences(f, value, eps=1e-4):
    value = np.asarray(value, np.float64)
    grad = np.zeros_like(value)
    for i in np.ndindex(value.shape):
        up, down = value.copy(), value.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(up) - f(down)) / (2 * eps)
    return grad


def test_gradients_through_broadcasting_and_reductions_match_central_differences():
    rng = np.random.default_rng(11)
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float64, name="x")
        w = tf.Variable(rng.normal(size=3), name="w")                # broadcast over x's leading axes
        c = tf.placeholder(tf.float64, name="c")
        h = tf.tanh(x * w + c)
        loss = tf.reduce_sum(tf.reduce_max(h, axis=-1)) + tf.reduce_sum(tf.reduce_mean(h * h, axis=0, keepdims=True))
        gx, gw, gc = tf.gradients(loss, [x, w, c])
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            W = sess.run(w)

            def f(xv, cv):
                hv = np.tanh(xv * W + cv)
                return np.sum(hv.max(axis=-1)) + np.sum((hv * hv).mean(axis=0, keepdims=True))

            for X, C in ((rng.normal(size=(4, 3)), rng.normal(size=(1, 3))),
                         (rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 1, 1)))):
                got_x, got_w, got_c = sess.run([gx, gw, gc], {x: X, c: C})
                assert np.allclose(got_x, _central_differences(lambda v: f(v, C), X), atol=1e-6)
                assert np.allclose(got_c, _central_differences(lambda v: f(X, v), C), atol=1e-6)
                want_w = _central_differences(lambda v: np.sum(
                    np.tanh(X * v + C).max(axis=-1)) + np.sum((np.tanh(X * v + C) ** 2).mean(axis=0, keepdims=True)), W)
                assert got_w.shape == (3,) and np.allclose(got_w, want_w, atol=1e-6)


def test_long_elementwise_chains_on_unknown_rank_run_fused_and_right():
    # eight and more elementwise ops become one fused kernel, with buffer reuse: with unknown shapes
    # the plan must still give numpy's values for every fed rank
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, name="x")
        y = x
        for k in range(10):
            y = tf.abs(y * 1.5 - 0.25) + tf.constant(float(k)) * 0.125
        with tf.Session() as sess:
            for value in (0.5, np.linspace(-1, 1, 7), np.linspace(-2, 2, 600).reshape(3, 200)):
                v = np.asarray(value, np.float32)
                want = v
                for k in range(10):
                    want = np.abs(want * np.float32(1.5) - np.float32(0.25)) + np.float32(k) * np.float32(0.125)
                assert np.allclose(sess.run(y, {x: value}), want, rtol=1e-6)


def test_core_graph_placeholder_takes_unknown_rank_when_asked():
    g = fl.Graph("g")
    with g.as_default():
        x = g.placeholder(fl.float32, fl.TensorShape(None), name="x")
        y = fl.reduce_sum(x * 3.0)
    assert x.shape.rank is None and y.shape == () and "<unknown>" in g.pretty()
