"""The gradient of an allreduce is an allreduce: collectives of flowlab tensors record on gradient
tapes, and their backward pass is the matching collective of the incoming gradients."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup
from flowlab.cluster.events import EventLog

T = 10.0
N = 3


def weights(rank):
    return np.array([1.0, 2.0, 3.0], np.float32) * (rank + 1)


def run(body, n=N, events=None):
    with LocalGroup(n, events=events) as group:
        return group.run(body)


@pytest.mark.parametrize("alg", ["ring", "tree", "naive"])
def test_gradient_of_allreduce_sum_is_the_allreduce_of_the_gradients(alg):
    def body(comm):
        x = fl.Variable(np.arange(3, dtype=np.float32) + comm.rank)
        with fl.GradientTape() as tape:
            y = C.allreduce(x, "sum", alg, timeout=T)
            loss = fl.reduce_sum(y * weights(comm.rank))
        return tape.gradient(loss, x).numpy()

    total = sum(weights(r) for r in range(N))
    for g in run(body):
        np.testing.assert_array_equal(g, total)


def test_gradient_of_allreduce_mean_is_the_mean_of_the_gradients():
    def body(comm):
        x = fl.constant(np.ones(3, np.float32) * comm.rank)
        with fl.GradientTape() as tape:
            tape.watch(x)
            loss = fl.reduce_sum(C.allreduce(x, "mean", timeout=T) * weights(comm.rank))
        return tape.gradient(loss, x).numpy()

    for g in run(body):
        np.testing.assert_allclose(g, sum(weights(r) for r in range(N)) / N, rtol=1e-6)


def test_gradient_of_allreduce_max_goes_to_the_ranks_that_held_the_max():
    def body(comm):
        # position 0: rank 2 holds the max; position 1: ranks 1 and 2 tie; position 2: all tie
        x = fl.constant(np.array([comm.rank, min(comm.rank, 1), 5.0], np.float32))
        with fl.GradientTape() as tape:
            tape.watch(x)
            loss = fl.reduce_sum(C.allreduce(x, "max", timeout=T) * weights(comm.rank))
        return tape.gradient(loss, x).numpy()

    grads = run(body)
    total = sum(weights(r) for r in range(N))    # [6, 12, 18]
    np.testing.assert_allclose(grads[0], [0, 0, 6])
    np.testing.assert_allclose(grads[1], [0, 6, 6])
    np.testing.assert_allclose(grads[2], [6, 6, 6])
    np.testing.assert_allclose(sum(grads), total)


def test_the_backward_pass_is_itself_a_collective_in_the_event_log():
    log = EventLog()

    def body(comm):
        x = fl.Variable([1.0, 2.0])
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(C.allreduce(x, timeout=T))
        tape.gradient(loss, x)

    run(body, events=log)
    calls = sorted((e.attrs["seq"], e.name) for e in log.events(kind="collective") if e.rank == 0)
    assert calls == [(1, "allreduce"), (2, "allreduce")]


def test_gradients_of_gradients_run_through_the_allreduce():
    def body(comm):
        x = fl.Variable([float(comm.rank + 1)])
        with fl.GradientTape() as outer:
            with fl.GradientTape() as inner:
                s = C.allreduce(x, timeout=T)          # s = sum_k x_k
                loss = fl.reduce_sum(s * s * x)        # d/dx_r = 2 s x_r (summed over ranks) + s^2
            g = inner.gradient(loss, x)
        return g.numpy(), outer.gradient(g, x).numpy()

    xs = [1.0, 2.0, 3.0]
    s = sum(xs)
    for r, (g, gg) in enumerate(run(body)):
        # d loss_k / d x_r = 2 s x_k + s^2 [k == r]; summed over k: 2 s * s + s^2 = 3 s^2
        np.testing.assert_allclose(g, [2 * s * s + s * s])
        # the inner gradient 2 s * allreduce(x) + s^2 = 3 s^2 with s = sum x: d/dx_r (summed) = 6 s * N... per rank
        np.testing.assert_allclose(gg, [6 * s * N], rtol=1e-6)


def test_allgather_gradient_is_a_reduce_scatter_and_back():
    def body(comm):
        x = fl.Variable(np.full((2, 2), float(comm.rank), np.float32))
        w = np.arange(N * 4, dtype=np.float32).reshape(N * 2, 2) * (comm.rank + 1)
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(C.allgather(x, timeout=T) * w)
        gx = tape.gradient(loss, x).numpy()

        v = fl.Variable(np.arange(5 * 2, dtype=np.float32).reshape(5, 2))
        with fl.GradientTape() as tape:
            part = C.reduce_scatter(v, "sum", timeout=T)
            loss = fl.reduce_sum(part * float(comm.rank + 1))
        return gx, tape.gradient(loss, v).numpy()

    results = run(body)
    w_total = np.arange(N * 4, dtype=np.float32).reshape(N * 2, 2) * sum(r + 1 for r in range(N))
    for r, (gx, gv) in enumerate(results):
        np.testing.assert_array_equal(gx, w_total[2 * r:2 * r + 2])
        # rows 0-1 went to rank 0 (weight 1), rows 2-3 to rank 1 (weight 2), row 4 to rank 2 (weight 3)
        np.testing.assert_array_equal(gv, np.repeat([[1.0], [1.0], [2.0], [2.0], [3.0]], 2, axis=1))


def test_broadcast_gradient_flows_to_the_root_only():
    def body(comm):
        x = fl.Variable([1.0, 1.0])
        with fl.GradientTape() as tape:
            loss = fl.reduce_sum(C.broadcast(x, root=1, timeout=T) * float(comm.rank + 1))
        return tape.gradient(loss, x).numpy()

    grads = run(body)
    assert grads[1].tolist() == [6.0, 6.0] and grads[0].tolist() == grads[2].tolist() == [0.0, 0.0]
