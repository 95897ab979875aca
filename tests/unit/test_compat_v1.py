"""``flowlab.compat.v1``, the TF1 API: graphs, sessions and feeds, variables and initializers,
``tf.gradients`` against eager GradientTape, TF1 optimizers, the plan cache, the default graph."""
from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest

import flowlab as fl
import flowlab.compat.v1 as tf
from flowlab.core.device import RemoteDeviceError

rng = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def fresh_default_graph():
    """Each test starts with an empty default graph and no default session."""
    tf.reset_default_graph()
    yield
    assert tf.get_default_session() is None, "a test left a default session behind"
    tf.reset_default_graph()
    fl.config.set_logical_devices("CPU", None)


def F(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- the default graph ------------------------------------------------------------------------------
def test_ops_outside_any_graph_scope_build_the_process_default_graph():
    g = tf.get_default_graph()
    x = tf.constant(2)
    y = (x + 300) + (x - 66)
    assert y.graph is g and isinstance(g, fl.Graph)
    assert {n.op.name for n in g.nodes} >= {"const", "add", "subtract"}
    with tf.Session() as sess:
        assert sess.run(y) == 238
        assert isinstance(sess.run(y), np.int32)


def test_reset_default_graph_starts_an_empty_one_and_refuses_inside_a_graph_scope():
    old = tf.get_default_graph()
    tf.constant(1.0)
    tf.reset_default_graph()
    new = tf.get_default_graph()
    assert new is not old and new.nodes == [] and len(old.nodes) == 1
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="reset_default_graph"):
        tf.reset_default_graph()


def test_a_graph_scope_overrides_the_default_and_tensors_remember_their_graph():
    g = tf.Graph()
    with g.as_default():
        assert tf.get_default_graph() is g
        x = tf.placeholder(tf.float32, [2], name="x")
    assert tf.get_default_graph() is not g
    y = x * 2.0 + 1.0                       # no scope: the operators use x's graph
    z = tf.reduce_sum(y)                    # so do tf functions
    assert y.graph is g and z.graph is g
    assert tf.get_default_graph().nodes == []
    with tf.Session(graph=g) as sess:
        np.testing.assert_allclose(sess.run(z, {x: [1.0, 2.0]}), 8.0)


def test_graph_tensors_are_hashable_and_equal_only_to_themselves():
    x = tf.placeholder(tf.float32, [3])
    y = tf.identity(x)
    assert x in {x: 1} and y not in {x: 1}
    assert (x == x) is True and (x == y) is False and (x != y) is True
    np.testing.assert_array_equal(tf.Session().run(tf.equal(x, y), {x: [1, 2, 3]}), [True] * 3)


def test_mixing_graphs_is_an_error_that_names_both():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(1.0)
    b = tf.constant(2.0)                    # the default graph
    with pytest.raises(fl.errors.InvalidArgumentError, match="another graph"):
        tf.add(b, a)
    with pytest.raises(ValueError, match="not an element of this session's graph"):
        tf.Session().run(a)


def test_names_name_scopes_and_lookup_by_name():
    with tf.name_scope("layer"):
        x = tf.placeholder(tf.float32, [2], name="x")
        y = tf.multiply(x, 3.0, name="scaled")
        z = y + 1.0
    g = tf.get_default_graph()
    assert x.name == "layer/x:0" and y.name == "layer/scaled:0" and z.name.startswith("layer/add")
    assert g.get_tensor_by_name("layer/scaled:0") is y
    with tf.Session() as sess:
        np.testing.assert_allclose(sess.run("layer/scaled:0", {"layer/x:0": [1.0, 2.0]}), [3.0, 6.0])
        assert sess.run(z.op.name, {x: [0.0, 0.0]}) is None   # an op name fetches the op


def test_finalized_graph_refuses_new_nodes():
    x = tf.placeholder(tf.float32, [])
    y = x + 1.0
    tf.get_default_graph().finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        y * 2.0
    with tf.Session() as sess:               # running is still fine
        assert sess.run(y, {x: 1.0}) == 2.0


# -- sessions: fetches ---------------------------------------------------------------------------
Pair = collections.namedtuple("Pair", "first second")


def test_nested_fetches_come_back_in_the_same_structure():
    x = tf.placeholder(tf.float32, [3], name="x")
    total, doubled = tf.reduce_sum(x), x * 2.0
    op = tf.group(total)
    fetches = {"total": total, "more": [doubled, (total, op)], "pair": Pair(total, doubled)}
    with tf.Session() as sess:
        out = sess.run(fetches, {x: [1.0, 2.0, 3.0]})
    assert set(out) == {"total", "more", "pair"}
    assert out["total"] == np.float32(6.0)
    assert isinstance(out["more"], list) and isinstance(out["more"][1], tuple)
    np.testing.assert_array_equal(out["more"][0], [2.0, 4.0, 6.0])
    assert out["more"][1][0] == 6.0 and out["more"][1][1] is None
    assert isinstance(out["pair"], Pair) and out["pair"].first == 6.0
    with tf.Session() as sess:
        assert sess.run([]) == [] and sess.run(()) == ()


def test_fetched_values_are_numpy_scalars_and_read_only_arrays():
    v = tf.Variable([1.0, 2.0])
    with tf.Session() as sess:
        sess.run(v.initializer)
        value = sess.run(v)
        assert isinstance(value, np.ndarray) and value.dtype == np.float32
        with pytest.raises(ValueError, match="read-only"):
            value[0] = 5.0                 # it may be the variable's own array
        assert isinstance(sess.run(tf.reduce_sum(v)), np.float32)


def test_fetching_variables_operations_and_names():
    v = tf.Variable(3.0, name="v")
    with tf.Session() as sess:
        assert sess.run(v.initializer) is None
        assert sess.run(v) == 3.0 and sess.run("v:0") == 3.0 and v.eval() == 3.0
        assert sess.run(v.assign(5.0)) == 5.0 and sess.run(v) == 5.0
        plain = fl.Variable([1.0, 2.0])          # a flowlab variable read by the graph
        np.testing.assert_array_equal(sess.run(plain), [1.0, 2.0])
        assert sess.run(fl.constant(4)) == 4     # an eager tensor is a constant of the graph
        with pytest.raises(TypeError, match="cannot fetch"):
            sess.run(None)
        with pytest.raises(KeyError, match="no operation"):
            sess.run("missing")


def test_eval_and_run_use_the_default_session():
    x = tf.placeholder(tf.float32, [])
    v = tf.Variable(1.0)
    bump = v.assign_add(x)
    with pytest.raises(ValueError, match="default session"):
        bump.op.run({x: 1.0})
    init = tf.global_variables_initializer()
    assert init.name == "init" and tf.get_default_graph().get_operation_by_name("init") is init
    with tf.Session() as sess:
        assert tf.get_default_session() is sess
        assert sess.run("init") is None
        init.run()
        v.initializer.run()
        bump.op.run({x: 2.5})
        assert bump.eval({x: 0.5}) == 4.0
    assert tf.get_default_session() is None
    sess = tf.Session()
    with sess.as_default():
        with pytest.raises(tf.errors.FailedPreconditionError, match="uninitialized value Variable"):
            v.eval()                       # a new session has values of its own, as in TF1
        init.run()
        bump.op.run({x: 0.25})
        assert v.eval() == 1.25
    assert sess.run(v) == 1.25             # as_default leaves it open
    sess.close()


def test_interactive_session_is_the_default_until_closed():
    x = tf.constant([1.0, 2.0])
    sess = tf.InteractiveSession()
    try:
        assert tf.get_default_session() is sess
        np.testing.assert_array_equal(x.eval(), [1.0, 2.0])
        assert fl.constant(1.0) + 1.0 == 2.0   # flowlab's eager ops stay eager
    finally:
        sess.close()
    assert tf.get_default_session() is None


def test_closed_and_remote_sessions():
    sess = tf.Session()
    sess.close()
    with pytest.raises(RuntimeError, match="closed Session"):
        sess.run(tf.constant(1))
    with pytest.raises(NotImplementedError, match="LocalCluster"):
        tf.Session("grpc://localhost:2222")


# -- sessions: feeds -------------------------------------------------------------------------------
def test_feeds_convert_lists_and_numpy_to_the_placeholder_dtype():
    x = tf.placeholder(tf.float32, [None, 2])
    n = tf.placeholder(tf.int32, [])
    y = tf.reduce_sum(x) * tf.cast(n, tf.float32)
    with tf.Session() as sess:
        assert sess.run(y, {x: [[1, 2], [3, 4]], n: 2}) == 20.0
        assert sess.run(y, {x: np.ones((3, 2), np.float64), n: np.int64(1)}) == 6.0
        out = sess.run(x, {x: np.ones((1, 2))})
        assert out.dtype == np.float32


def test_feeding_a_tensor_that_is_not_a_placeholder_replaces_it():
    x = tf.placeholder(tf.float32, [2])
    hidden = x * 10.0
    out = hidden + 1.0
    with tf.Session() as sess:
        np.testing.assert_allclose(sess.run(out, {hidden: [1.0, 2.0]}), [2.0, 3.0])   # x need not be fed
        np.testing.assert_allclose(sess.run(out, {x: [1.0, 2.0]}), [11.0, 21.0])
        v = tf.Variable(5.0)
        twice = v * 2.0
        assert sess.run(twice, {twice.op.inputs[0]: 1.0}) == 2.0   # feeding a read: no initializer needed


def test_bad_feeds_say_what_is_wrong():
    x = tf.placeholder(tf.float32, [None, 3], name="x")
    k = tf.placeholder(tf.int32, [2], name="k")
    s = tf.placeholder(tf.float32, name="s")          # no shape: any rank, as in TF1
    y = tf.reduce_sum(x)
    with tf.Session() as sess:
        with pytest.raises(ValueError, match=r"shape \(2, 2\) to x:0, which has shape \[None, 3\]"):
            sess.run(y, {x: np.ones((2, 2))})
        with pytest.raises(ValueError, match=r"shape \(3,\)"):
            sess.run(y, {x: np.ones(3)})
        with pytest.raises(TypeError, match="fractions to k:0"):
            sess.run(k, {k: [1.5, 2.0]})
        with pytest.raises(TypeError, match="feed numbers"):
            sess.run(y, {x: [["a", "b", "c"]]})
        assert sess.run(s, {s: [1.0, 2.0]}).tolist() == [1.0, 2.0]
        assert sess.run(s, {s: 2}) == 2.0
        with pytest.raises(fl.errors.InvalidArgumentError, match="x:0 must be fed"):
            sess.run(y)
        with pytest.raises(TypeError, match="value fed to x:0 is a graph tensor"):
            sess.run(y, {x: y})
        with pytest.raises(TypeError, match="cannot feed the variable"):
            v = tf.Variable(1.0)
            sess.run(y, {v: 1.0})
        other = tf.Graph()
        with other.as_default():
            foreign = tf.placeholder(tf.float32, [])
        with pytest.raises(ValueError, match="not an element"):
            sess.run(y, {foreign: 1.0, x: np.ones((1, 3))})


def test_fed_arrays_are_copied():
    x = tf.placeholder(tf.float32, [2])
    v = tf.Variable([0.0, 0.0])
    store = v.assign(x)
    data = np.array([1.0, 2.0], np.float32)
    with tf.Session() as sess:
        sess.run(store, {x: data})
        data[0] = 100.0
        np.testing.assert_array_equal(sess.run(v), [1.0, 2.0])


# -- placement --------------------------------------------------------------------------------------
def test_nodes_keep_their_device_and_local_devices_run_in_the_session(capsys):
    fl.config.set_logical_devices("CPU", 2)
    x = tf.placeholder(tf.float32, [4])
    with tf.device("/cpu:1"):
        y = tf.reduce_sum(x * 2.0)
    assert y.op.device.to_string() == "/device:CPU:1"
    config = tf.ConfigProto(log_device_placement=True)
    with tf.Session(config=config) as sess:
        assert sess.run(y, {x: [1, 2, 3, 4]}) == 20.0
    assert "device:CPU:1" in capsys.readouterr().err


def test_missing_local_devices_fail_unless_soft_placement_and_remote_ones_need_a_cluster():
    with tf.device("/cpu:7"):                       # this process has one CPU device
        y = tf.constant(1.0) + 1.0
    with tf.Session() as sess, pytest.raises(fl.errors.InvalidArgumentError, match="allow_soft_placement"):
        sess.run(y)
    with tf.Session(config=tf.ConfigProto(allow_soft_placement=True)) as sess:
        assert sess.run(y) == 2.0
    with tf.device("/job:worker/task:1"):
        z = tf.constant(1.0) * 3.0
    with tf.Session() as sess, pytest.raises(RemoteDeviceError, match="another job or task"):
        sess.run(z)


# -- variables and initializers ----------------------------------------------------------------------
def test_a_variable_is_uninitialized_until_its_initializer_runs():
    w = tf.Variable(tf.random_normal([3, 2]), name="weights")
    y = tf.reduce_sum(w)
    assert w.shape == (3, 2) and w.dtype == tf.float32 and w.name == "weights:0"
    with tf.Session() as sess:
        with pytest.raises(tf.errors.FailedPreconditionError, match="uninitialized value weights") as info:
            sess.run(y)
        assert isinstance(info.value, fl.errors.OpError)
        with pytest.raises(tf.errors.FailedPreconditionError, match="weights"):
            w.numpy()
        sess.run(tf.global_variables_initializer())
        first = sess.run(w)
        assert first.shape == (3, 2) and np.isclose(sess.run(y), first.sum())
        np.testing.assert_array_equal(sess.run(w), first)   # the random initial value was drawn once
        np.testing.assert_array_equal(w.numpy(), first)
        sess.run(w.initializer)
        assert not np.array_equal(sess.run(w), first)       # re-initializing draws again


def test_initial_values_can_depend_on_other_variables():
    a = tf.Variable([1.0, 2.0], name="a")
    b = tf.Variable(a.initialized_value() * 2.0, name="b")
    c = tf.Variable(a * 3.0, name="c")
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(b), [2.0, 4.0])
        np.testing.assert_array_equal(sess.run(c), [3.0, 6.0])


def test_variables_initializer_initializes_only_its_list():
    a, b = tf.Variable(1.0, name="a"), tf.Variable(2.0, name="b")
    with tf.Session() as sess:
        sess.run(tf.variables_initializer([a]))
        assert sess.run(a) == 1.0
        with pytest.raises(tf.errors.FailedPreconditionError, match="value b"):
            sess.run(a + b)


def test_collections_names_and_trainability():
    a = tf.Variable(1.0, name="w")
    b = tf.Variable(2.0, name="w")
    c = tf.Variable(0, trainable=False, name="count")
    assert (a.name, b.name) == ("w:0", "w_1:0")
    assert tf.global_variables() == [a, b, c]
    assert tf.trainable_variables() == [a, b]
    assert tf.get_collection(tf.GraphKeys.GLOBAL_VARIABLES) == [a, b, c]
    assert "uninitialized" not in repr(a) and "w:0" in repr(a)


def test_assign_ops_and_load():
    v = tf.Variable([1.0, 2.0])
    add = v.assign_add([1.0, 1.0])
    sub = tf.assign_sub(v, [0.5, 0.5])
    with tf.Session() as sess:
        v.load([10.0, 20.0], sess)
        np.testing.assert_array_equal(sess.run(add), [11.0, 21.0])
        np.testing.assert_array_equal(sess.run(sub), [10.5, 20.5])
        with pytest.raises(fl.errors.InvalidArgumentError, match="shape"):
            v.load([1.0, 2.0, 3.0])
        with pytest.raises(fl.errors.InvalidArgumentError, match="shape"):
            v.assign([1.0, 2.0, 3.0])


def test_get_variable_reuse_rules():
    with tf.variable_scope("layer"):
        w = tf.get_variable("w", [3, 2], initializer=tf.zeros_initializer())
        b = tf.get_variable("b", initializer=tf.constant([1.0, 2.0]))
    assert w.name == "layer/w:0" and b.name == "layer/b:0"
    with pytest.raises(ValueError, match="already exists"):
        with tf.variable_scope("layer"):
            tf.get_variable("w", [3, 2])
    with tf.variable_scope("layer", reuse=True):
        assert tf.get_variable("w", [3, 2]) is w
        with tf.variable_scope("inner"):       # reuse is inherited
            with pytest.raises(ValueError, match="does not exist"):
                tf.get_variable("v", [1])
        with pytest.raises(ValueError, match="has shape"):
            tf.get_variable("w", [2, 2])
    with tf.variable_scope("layer", reuse=tf.AUTO_REUSE):
        assert tf.get_variable("w") is w
        fresh = tf.get_variable("c", [4], initializer=tf.ones_initializer())
    with tf.variable_scope("layer", reuse=tf.AUTO_REUSE):
        assert tf.get_variable("c") is fresh
    default = tf.get_variable("glorot", [20, 30])
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(w), np.zeros((3, 2)))
        np.testing.assert_array_equal(sess.run(b), [1.0, 2.0])
        values = sess.run(default)
    limit = np.sqrt(6.0 / 50)
    assert np.abs(values).max() <= limit and values.std() > limit / 4   # Glorot-uniform, get_variable's default


# -- tf.gradients against eager GradientTape -----------------------------------------------------------
def _quadratic(x, w):
    return fl.reduce_sum(x * x + 3.0 * x) + fl.reduce_sum(w)


def _tanh_layer(x, w):
    return fl.reduce_mean(fl.tanh(fl.matmul(x, w)))


def _broadcast_square(x, w):
    return fl.reduce_sum((x + w[0]) ** 2 / (1.0 + fl.exp(w[1])))


def _softmax_xent(x, w):
    labels = fl.one_hot(fl.constant([0, 2, 1, 0]), 2)
    logits = fl.matmul(x, w)
    return fl.reduce_mean(fl.nn.softmax_cross_entropy_with_logits(labels, logits))


def _sparse_xent_max(x, w):
    logits = fl.matmul(fl.nn.relu(x), w)
    return (fl.reduce_sum(fl.sparse_softmax_cross_entropy_with_logits(fl.constant([1, 0, 1, 1]), logits))
            + fl.reduce_max(logits) + fl.reduce_sum(fl.log(fl.square(w) + 1.0)))


def _reuse_and_slices(x, w):
    h = fl.sigmoid(fl.matmul(x, w))
    return fl.reduce_sum(h * h) + fl.reduce_sum(h[:, 0] * x[:, 1]) + fl.reduce_mean(fl.reshape(h, [-1]))


@pytest.mark.parametrize("fn,w_shape,batch", [
    (_quadratic, (3,), None), (_tanh_layer, (3, 2), None), (_broadcast_square, (2, 3), None),
    # NOTE: 4, not None: the cross-entropy shape rules refuse labels (4, ...) next to logits (None, 2),
    # and getitem refuses a tensor of partly unknown shape
    (_softmax_xent, (3, 2), 4), (_sparse_xent_max, (3, 2), 4), (_reuse_and_slices, (3, 2), 4),
], ids=lambda p: getattr(p, "__name__", "") if callable(p) else "")
def test_gradients_match_eager_gradient_tape(fn, w_shape, batch):
    x_value, w_value = F(4, 3), F(*w_shape)
    x_eager, w_eager = fl.constant(x_value), fl.Variable(w_value)
    with fl.GradientTape() as tape:
        tape.watch(x_eager)
        want_loss = fn(x_eager, w_eager)
    want = tape.gradient(want_loss, [x_eager, w_eager])

    x = tf.placeholder(tf.float32, [batch, 3])    # an unknown batch size: dynamic-shape gradients
    w = tf.Variable(w_value)
    with tf.get_default_graph().as_default():
        loss = fn(x, w)
    grads = tf.gradients(loss, [x, w])
    with tf.Session() as sess:
        sess.run(w.initializer)
        got_loss, got = sess.run([loss, grads], {x: x_value})
    np.testing.assert_allclose(got_loss, want_loss.numpy(), rtol=1e-5, atol=1e-6)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-6)


def test_gradients_of_several_ys_with_weights_and_second_derivatives():
    x = tf.placeholder(tf.float32, [3])
    y1, y2 = tf.reduce_sum(x ** 3), x * 2.0
    (dx,) = tf.gradients([y1, y2], x, grad_ys=[2.0, [1.0, 0.0, -1.0]])
    (d2x,) = tf.gradients(tf.gradients(y1, x)[0], x)   # d/dx sum(3x^2) = 6x
    value = np.array([1.0, 2.0, 3.0], np.float32)
    with tf.Session() as sess:
        got, second = sess.run([dx, d2x], {x: value})
    np.testing.assert_allclose(got, 2 * 3 * value ** 2 + [2.0, 0.0, -2.0])
    np.testing.assert_allclose(second, 6 * value)


def test_gradients_that_do_not_exist():
    x = tf.placeholder(tf.float32, [2])
    n = tf.placeholder(tf.int32, [2])
    unrelated = tf.placeholder(tf.float32, [2])
    y = tf.reduce_sum(x * tf.cast(n, tf.float32)) + tf.reduce_sum(tf.stop_gradient(x * x))
    gx, gn, gu = tf.gradients(y, [x, n, unrelated])
    assert gn is None and gu is None
    (zeros,) = tf.gradients(y, [unrelated], unconnected_gradients="zero")
    h = x * 2.0
    (blocked,) = tf.gradients(tf.reduce_sum(h * x), [x], stop_gradients=[h])   # h counts as a constant
    with tf.Session() as sess:
        feed = {x: [1.0, 2.0], n: [3, 4], unrelated: [0.0, 0.0]}
        np.testing.assert_allclose(sess.run(gx, feed), [3.0, 4.0])     # stop_gradient hid the x*x term
        np.testing.assert_allclose(sess.run(zeros, feed), [0.0, 0.0])
        np.testing.assert_allclose(sess.run(blocked, feed), [2.0, 4.0])


# -- tf.train -------------------------------------------------------------------------------------
def _regression_data(n=64):
    x = F(n, 3)
    true_w, true_b = np.array([[2.0], [-1.0], [0.5]], np.float32), 0.3
    return x, x @ true_w + true_b, true_w, true_b


def test_linear_regression_with_gradient_descent_reaches_the_true_weights():
    data_x, data_y, true_w, true_b = _regression_data()
    x = tf.placeholder(tf.float32, [None, 3])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.Variable(tf.zeros([3, 1]), name="w")
    b = tf.Variable(0.0, name="b")
    loss = tf.losses.mean_squared_error(y, tf.matmul(x, w) + b)
    step = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert step.type == "NoOp" and [t.op.type for t in step.inputs] == ["assign", "assign"]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        losses = [sess.run([step, loss], {x: data_x, y: data_y})[1] for _ in range(300)]
        np.testing.assert_allclose(sess.run(w), true_w, atol=1e-4)
        np.testing.assert_allclose(sess.run(b), true_b, atol=1e-4)
    assert losses[-1] < 1e-6 < losses[0]


def test_one_gradient_descent_step_is_w_minus_lr_times_grad():
    data_x, data_y, _, _ = _regression_data(8)
    x, y = tf.constant(data_x), tf.constant(data_y)
    w = tf.Variable(np.ones((3, 1), np.float32))
    lr = tf.placeholder(tf.float32, [])                      # a tensor learning rate
    opt = tf.train.GradientDescentOptimizer(lr)
    pairs = opt.compute_gradients(tf.reduce_mean(tf.square(tf.matmul(x, w) - y)))
    assert pairs[0][1] is w
    step = opt.apply_gradients(pairs, global_step=tf.train.get_or_create_global_step())
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(step, {lr: 0.05})
        grad = 2 * data_x.T @ (data_x @ np.ones((3, 1)) - data_y) / 8
        np.testing.assert_allclose(sess.run(w), 1 - 0.05 * grad, rtol=1e-5)
        assert sess.run(tf.train.get_global_step()) == 1


@pytest.mark.parametrize("make", [
    lambda: tf.train.MomentumOptimizer(0.05, 0.9),
    lambda: tf.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True),
    lambda: tf.train.AdamOptimizer(0.1),
], ids=["momentum", "nesterov", "adam"])
def test_flowlab_update_rules_train_in_a_session(make):
    data_x, data_y, true_w, true_b = _regression_data()
    x, y = tf.placeholder(tf.float32, [None, 3]), tf.placeholder(tf.float32, [None, 1])
    w, b = tf.Variable(tf.zeros([3, 1])), tf.Variable(0.0)
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    step = make().minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(300):
            sess.run(step, {x: data_x, y: data_y})
        np.testing.assert_allclose(sess.run(w), true_w, atol=1e-2)


def test_minimize_without_gradients_is_an_error():
    w = tf.Variable(1.0)
    n = tf.Variable(2.0)
    with pytest.raises(ValueError, match="no gradients"):
        tf.train.GradientDescentOptimizer(0.1).minimize(tf.stop_gradient(w * n))


# -- the plan cache ----------------------------------------------------------------------------------
def test_runs_reuse_compiled_plans_until_the_graph_changes():
    x = tf.placeholder(tf.float32, [2])
    y = tf.reduce_sum(x * 2.0)
    with tf.Session() as sess:
        for i in range(5):
            sess.run(y, {x: [i, i]})
        assert sess.plans_compiled == 1
        sess.run([y, x], {x: [1, 1]})               # other fetches: another plan
        sess.run({"y": y}, {x: [1, 1]})             # the same tensor in another structure: the same plan
        assert sess.plans_compiled == 2
        z = y + 1.0                                 # the graph changed: recompile
        assert sess.run(y, {x: [1, 1]}) == 4.0
        assert sess.plans_compiled == 3
        assert sess.run(z, {x: [1, 1]}) == 5.0
        sess.run(y, {x: [2, 2]})
        assert sess.plans_compiled == 4


def test_a_graph_that_grows_in_the_loop_is_reported():
    x = tf.placeholder(tf.float32, [])
    with tf.Session() as sess, pytest.warns(UserWarning, match="loop is making ops"):
        for _ in range(30):
            sess.run(x * 2.0, {x: 1.0})               # x * 2.0 makes a node each time
    with tf.Session() as sess, warnings.catch_warnings():
        warnings.simplefilter("error")
        y = x * 2.0
        for _ in range(30):
            sess.run(y, {x: 1.0})


def test_runs_compute_only_what_the_fetches_need():
    v = tf.Variable(0.0)
    bump = v.assign_add(1.0)
    read = v + 0.0
    with tf.Session() as sess:
        sess.run(v.initializer)
        for _ in range(3):
            sess.run(read)                          # bump is not needed: it does not run
        assert sess.run(v) == 0.0
        sess.run([bump, read])
        assert sess.run(v) == 1.0


# -- the TF1 op names ----------------------------------------------------------------------------------
def test_tf1_op_names_and_signatures():
    x = tf.placeholder(tf.float32, [2, 3])
    labels = tf.placeholder(tf.int32, [2])
    value = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    fetches = {
        "mean_rows": tf.reduce_mean(x, reduction_indices=[1], keep_dims=True),
        "argmax": tf.argmax(x, 1),
        "argmax0": tf.argmax(x),
        "softmax": tf.nn.softmax(x),
        "xent": tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=x),
        "xent_v2": tf.nn.softmax_cross_entropy_with_logits_v2(labels=tf.one_hot(labels, 3), logits=x),
        "mse": tf.losses.mean_squared_error(tf.zeros([2, 3]), x),
        "relu": tf.nn.relu(x),
        "to_float": tf.to_float(labels),
        "equal": tf.equal(tf.argmax(x, 1), tf.cast(labels, tf.int64)),
        "shape": tf.shape(x), "size": tf.size(x),
        "ones": tf.ones([2]), "zeros": tf.zeros([2], tf.int32),
        "sub": tf.subtract(x, 1.0), "mul": tf.multiply(x, x), "slice": tf.slice(x, [0, 1], [2, 2]),
        "reshape": tf.reshape(x, [3, 2]), "sq": tf.square(x),
    }
    with tf.Session() as sess:
        out = sess.run(fetches, {x: value, labels: [2, 1]})
    np.testing.assert_allclose(out["mean_rows"], value.mean(1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(out["argmax"], [2, 1])
    np.testing.assert_array_equal(out["argmax0"], [0, 1, 0])
    e = np.exp(value - value.max(1, keepdims=True))
    np.testing.assert_allclose(out["softmax"], e / e.sum(1, keepdims=True), rtol=1e-6)
    want_xent = -np.log((e / e.sum(1, keepdims=True))[[0, 1], [2, 1]])
    np.testing.assert_allclose(out["xent"], want_xent, rtol=1e-5)
    np.testing.assert_allclose(out["xent_v2"], want_xent, rtol=1e-5)
    np.testing.assert_allclose(out["mse"], (value ** 2).mean(), rtol=1e-6)
    np.testing.assert_array_equal(out["equal"], [True, True])
    np.testing.assert_array_equal(out["shape"], [2, 3])
    assert out["size"] == 6 and out["to_float"].dtype == np.float32
    np.testing.assert_array_equal(out["slice"], value[:, 1:3])
    np.testing.assert_array_equal(out["zeros"], [0, 0])


def test_shape_and_size_of_unknown_dimensions_are_computed_when_the_graph_runs():
    x = tf.placeholder(tf.float32, [None, 3])
    n = tf.size(x)
    with tf.Session() as sess:
        assert sess.run(n, {x: np.ones((4, 3))}) == 12
        np.testing.assert_array_equal(sess.run(tf.shape(x), {x: np.ones((2, 3))}), [2, 3])
        assert sess.run(tf.reduce_sum(x) / tf.cast(n, tf.float32), {x: np.ones((5, 3))}) == 1.0


def test_random_ops_draw_anew_on_each_run():
    r = tf.random_normal([1000], mean=2.0, stddev=0.5)
    u = tf.random_uniform([1000], minval=-1.0, maxval=1.0)
    with tf.Session() as sess:
        a, b = sess.run(r), sess.run(r)
        assert not np.array_equal(a, b) and abs(a.mean() - 2.0) < 0.1 and abs(a.std() - 0.5) < 0.1
        values = sess.run(u)
        assert values.min() >= -1.0 and values.max() < 1.0


# -- control dependencies ------------------------------------------------------------------------
def test_control_dependencies_on_a_train_op_run_the_step_first():
    x = tf.placeholder(tf.float32, [None, 2])
    w = tf.Variable([[1.0], [2.0]], name="w")
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.control_dependencies([train_op]):
        loss_after = tf.identity(loss)          # the seeds' idiom: the loss of this step, after it
        w_after = tf.identity(w)                # a new read of w: after the update
    assert "^" in tf.get_default_graph().pretty()
    feed = {x: [[1.0, 1.0]]}
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        before = sess.run(loss, feed)
        w0 = sess.run(w)
        got_loss, got_w = sess.run([loss_after, w_after], feed)   # one step, not two
        assert got_loss == pytest.approx(before)
        grad = 2 * np.array([[1.0], [1.0]]) * 3.0
        np.testing.assert_allclose(got_w, w0 - 0.1 * grad, rtol=1e-6)
        np.testing.assert_allclose(sess.run(w), got_w)
        sess.run(w_after, feed)                                # fetching it alone runs the step
        assert not np.allclose(sess.run(w), got_w)


def test_control_dependencies_nest_clear_and_reach_group_and_no_op():
    v = tf.Variable(0.0, name="v")
    bump = tf.assign_add(v, 1.0)
    other = tf.assign_add(v, 10.0)
    with tf.control_dependencies([bump]):
        with tf.control_dependencies([tf.group(other)]):
            both = tf.no_op(name="both")
            read_both = tf.identity(v)
        with tf.control_dependencies(None):
            plain = tf.identity(v)
    with tf.Session() as sess:
        sess.run(v.initializer)
        assert sess.run(both) is None and sess.run(v) == 11.0
        assert sess.run(read_both) == 22.0
        assert sess.run(plain) == 22.0
    with pytest.raises(TypeError, match="takes operations and tensors"):
        with tf.control_dependencies([3]):
            pass


def test_control_dependencies_outside_a_with_block_use_the_tensors_graph():
    g = tf.Graph()
    with g.as_default():
        v = tf.Variable(1.0)
        step = v.assign(v * 2.0)
    with tf.control_dependencies([step]):     # g is not the default graph here
        after = tf.identity(v)
    assert after.graph is g
    with tf.Session(graph=g) as sess:
        sess.run(v.initializer)
        assert sess.run(after) == 2.0 and sess.run(after) == 4.0


def test_names_are_unique_as_in_tensorflow():
    a = tf.constant(1.0, name="a")
    a1 = tf.constant(1.0, name="a_1")
    a_again = tf.constant(1.0, name="a")
    assert (a.name, a1.name, a_again.name) == ("a:0", "a_1:0", "a_2:0")
    with tf.variable_scope("net"):
        w = tf.get_variable("w", [2], initializer=tf.zeros_initializer())
        x = tf.Variable(1.0, name="x")
    assert w.name == "net/w:0" and w.initializer.name == "net/w/Assign"
    assert x.name == "net/x:0" and x.initializer.name == "net/x/Assign"


# -- each local session owns its variables' values ------------------------------------------------
def test_two_sessions_on_one_graph_hold_separate_values():
    w = tf.Variable([1.0, 2.0], name="w")
    step = w.assign_add([10.0, 10.0])
    init = tf.global_variables_initializer()
    a, b = tf.Session(), tf.Session()
    try:
        a.run(init)
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            b.run(w)                          # initialized in a, not in b
        assert "uninitialized value w" in str(info.value) and "this session" in str(info.value)
        np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])   # b's failed run put back a's value
        b.run(init)
        a.run(step)
        a.run(step)
        b.run(step)
        np.testing.assert_array_equal(a.run(w), [21.0, 22.0])
        np.testing.assert_array_equal(b.run(w), [11.0, 12.0])
        np.testing.assert_array_equal(a.variable_value(w), [21.0, 22.0])
        w.load([0.0, 0.0], b)                 # load sets it in that session only
        np.testing.assert_array_equal(b.run(w), [0.0, 0.0])
        np.testing.assert_array_equal(a.run(w), [21.0, 22.0])
    finally:
        a.close()
        b.close()
    with tf.Session() as c:                   # a new session starts uninitialized again
        with pytest.raises(tf.errors.FailedPreconditionError):
            c.variable_value(w)
    with pytest.raises(ValueError, match="needs a session"):
        w.load([1.0, 1.0])


def test_sessions_in_threads_do_not_mix_their_values():
    import threading
    w = tf.Variable(0.0, name="counter")
    bump = w.assign_add(1.0)
    init = tf.global_variables_initializer()
    sessions = [tf.Session() for _ in range(3)]
    errors = []

    def work(sess, n):
        try:
            sess.run(init)
            for _ in range(n):
                sess.run(bump)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s, 50 * (i + 1))) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert [s.run(w) for s in sessions] == [50.0, 100.0, 150.0]
    for s in sessions:
        s.close()


def test_trained_weights_stay_in_their_session():
    x = tf.placeholder(tf.float32, [None, 2])
    w = tf.Variable([[0.5], [-0.5]])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
    step = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    init = tf.global_variables_initializer()
    feed = {x: [[1.0, 2.0], [3.0, 4.0]]}
    with tf.Session() as trained:
        trained.run(init)
        for _ in range(5):
            trained.run(step, feed)
        after = trained.run(w)
        with tf.Session() as fresh:
            fresh.run(init)
            np.testing.assert_array_equal(fresh.run(w), [[0.5], [-0.5]])
        np.testing.assert_array_equal(trained.run(w), after)
