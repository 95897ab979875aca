"""Traced functions with ops on a cluster's tasks: ``fl.device("/job:worker/task:N")`` inside
``@fl.function`` runs those ops on that task, through the partitioned runner a cluster Session uses
(send/recv pairs between tasks), on real worker processes. Values equal eager ones, the event log
shows where each op ran, gradients flow through it, and errors say what to do."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster.errors import ClusterError
from flowlab.core.device import RemoteDeviceError
from flowlab.core.executor import Plan

pytestmark = pytest.mark.process

RNG = np.random.RandomState(0)
A = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal((3, 5)).astype(np.float32)


# the first two tests need no cluster open in this process: they run before the module's starts
def ops_by_task(cluster):
    return [(e.task, e.name) for e in cluster.events() if e.kind == "op"]


def program(a, b, device=None):
    with fl.device(device):
        h = fl.nn.relu(fl.matmul(a, b) + 0.5)
    return fl.reduce_sum(h * h, axis=1) - 1.0


def test_without_a_cluster_the_error_names_the_device_and_says_to_start_one():
    @fl.function
    def f(x):
        with fl.device("/job:worker/task:1"):
            return x * 2.0

    assert not fl.cluster.clusters(), "this test runs first in its module, before the module's cluster starts"
    with pytest.raises(RemoteDeviceError) as info:
        f(fl.constant([1.0]))
    text = str(info.value)
    assert "/job:worker/replica:0/task:1" in text and "LocalCluster" in text and "traced function" in text


def test_a_function_traced_on_a_closed_cluster_runs_on_the_next_one(make_cluster):
    @fl.function
    def f(x):
        with fl.device("/job:worker/task:0"):
            return x * 3.0

    assert not fl.cluster.clusters(), "this test runs before the module's cluster starts"
    c = make_cluster(workers=1)
    np.testing.assert_allclose(f(fl.constant([1.0, 2.0])).numpy(), [3.0, 6.0])
    c.close()
    with pytest.raises(RemoteDeviceError, match="LocalCluster"):
        f(fl.constant([1.0, 2.0]))
    c2 = make_cluster(workers=1)
    c2.events(clear=True)
    np.testing.assert_allclose(f(fl.constant([1.0, 2.0])).numpy(), [3.0, 6.0])
    ran = ops_by_task(c2)
    assert ("/job:worker/task:0", "multiply") in ran and {t for t, _ in ran} == {"/job:worker/task:0"}


def test_a_traced_function_runs_its_placed_ops_on_the_task(cluster):
    f = fl.function(lambda a, b: program(a, b, "/job:worker/task:1"))
    a, b = fl.constant(A), fl.constant(B)
    cluster.events(clear=True)
    got = f(a, b)
    assert isinstance(got, fl.Tensor) and not hasattr(got, "task")     # a value here, not a handle
    np.testing.assert_allclose(got.numpy(), program(a, b).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got.numpy(), program(a, b, "/job:worker/task:1").numpy(), rtol=1e-6)   # eager remote
    ran = ops_by_task(cluster)
    assert ("/job:worker/task:1", "matmul") in ran, ran
    assert {t for t, _ in ran} == {"/job:worker/task:1"}                # the eager call above ran there too
    assert not isinstance(f.get_concrete_function(a, b)._plan, Plan)      # the partitioned one
    cluster.events(clear=True)
    f(a, b)                                                              # a second call: no new trace
    assert f.experimental_get_tracing_count() == 1
    assert len(ops_by_task(cluster)) >= 3


def test_values_cross_between_tasks_directly_as_send_recv_pairs(cluster):
    @fl.function
    def f(x):
        with fl.device("/job:worker/task:0"):
            y = fl.matmul(x, x) * 2.0
        with fl.device("/job:worker/task:1"):
            z = fl.tanh(y) + y
        return z, y

    x = fl.constant(A[:3])
    cluster.events(clear=True)
    z, y = f(x)
    want_y = np.matmul(A[:3], A[:3]) * 2.0
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-5)
    np.testing.assert_allclose(z.numpy(), np.tanh(want_y) + want_y, rtol=1e-5)
    evs = cluster.events()
    ops = {(e.task, e.name) for e in evs if e.kind == "op"}
    assert {t for t, _ in ops} == {"/job:worker/task:0", "/job:worker/task:1"}
    sends = {(e.task, e.attrs["peer"]) for e in evs if e.kind == "send"}
    assert ("/job:worker/task:0", "/job:worker/task:1") in sends        # task to task, not through here


def test_a_local_only_function_keeps_the_compiled_plan(cluster):
    f = fl.function(lambda a, b: program(a, b))
    f(fl.constant(A), fl.constant(B))
    assert isinstance(f.get_concrete_function(fl.constant(A), fl.constant(B))._plan, Plan)


def test_variables_stay_here_and_effects_keep_their_order(cluster):
    w = fl.Variable(B)

    @fl.function
    def step(a):
        with fl.device("/job:worker/task:1"):
            y = fl.reduce_sum(fl.matmul(a, w))        # w's value travels there; w stays here
        w.assign(w * 2.0)
        return y

    a = fl.constant(A)
    first = float(step(a))
    np.testing.assert_allclose(first, float(np.matmul(A, B).sum()), rtol=1e-5)
    second = float(step(a))
    np.testing.assert_allclose(second, 2 * first, rtol=1e-5)             # read w after the first step's assign
    np.testing.assert_allclose(w.numpy(), B * 4.0)


def test_a_variable_update_fed_by_a_remote_value(cluster):
    count = fl.Variable(0.0)

    @fl.function
    def step(a):
        with fl.device("/job:worker/task:1"):
            y = fl.reduce_sum(a)
        count.assign_add(y)                            # placed where y is (task 1), runs here
        return y

    step(fl.constant(A))
    step(fl.constant(A))
    np.testing.assert_allclose(float(count.numpy()), 2 * A.sum(), rtol=1e-5)


def test_gradients_through_a_traced_function_with_a_remote_op(cluster):
    w = fl.Variable(B)

    def loss(a):
        with fl.device("/job:worker/task:1"):
            h = fl.tanh(fl.matmul(a, w))
        return fl.reduce_sum(h * h)

    traced = fl.function(loss)
    a = fl.constant(A)
    with fl.GradientTape() as tape:
        tape.watch(a)
        got = tape.gradient(traced(a), [a, w])
    local = fl.Variable(B)
    with fl.GradientTape() as tape:
        tape.watch(a)
        h = fl.tanh(fl.matmul(a, local))
        want = tape.gradient(fl.reduce_sum(h * h), [a, local])
    for g, wg in zip(got, want):
        np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-5, atol=1e-6)

    @fl.function
    def inside(a):                                     # the tape inside the function
        with fl.GradientTape() as tape:
            tape.watch(a)
            value = loss(a)
        return tape.gradient(value, a)

    cluster.events(clear=True)
    np.testing.assert_allclose(inside(a).numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
    assert ("/job:worker/task:1", "tanh") in ops_by_task(cluster)


def test_fit_with_layers_under_a_remote_scope(cluster):
    x = RNG.rand(32, 3).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)

    def model_under(device):
        with fl.device(device):
            m = fl.keras.Sequential([fl.keras.layers.Dense(4, activation="relu"), fl.keras.layers.Dense(1)])
            m.build((None, 3))
        m.compile(optimizer="sgd", loss="mse")
        return m

    here, there = model_under(None), model_under("/job:worker/task:1")
    there.set_weights(here.get_weights())
    cluster.events(clear=True)
    got = there.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0).history["loss"]
    ran = ops_by_task(cluster)
    want = here.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert ran and {t for t, _ in ran} == {"/job:worker/task:1"}


def test_a_dead_worker_gives_the_clusters_error(make_cluster):
    @fl.function
    def f(x):
        with fl.device("/job:worker/task:1"):
            return fl.matmul(x, x)

    c = make_cluster(workers=2)
    x = fl.constant(A[:3])
    np.testing.assert_allclose(f(x).numpy(), np.matmul(A[:3], A[:3]), rtol=1e-5)
    c.kill(1)
    with pytest.raises(ClusterError) as info:
        f(x)
    text = str(info.value)
    assert "/job:worker/task:1" in text and ("died" in text or "killed" in text or "SIGKILL" in text), text
