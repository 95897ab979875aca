"""The collectives as ops of core's table (flowlab/cluster/collectives/ops.py): a graph node inside
``@fl.function``, the same values traced as eager, gradients from the table entry (an eager tape and
a traced tape agree), errors that keep their class, and the communicator selectors' order."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup
from flowlab.core.errors import OpError
from flowlab.core.execute import get_op

T = 20.0
COLLECTIVES = {
    "allreduce": lambda x: C.allreduce(x, "sum", timeout=T),
    "allreduce_mean": lambda x: C.allreduce(x, "mean", algorithm="tree", timeout=T),
    "allreduce_max": lambda x: C.allreduce(x, "max", timeout=T),
    "broadcast": lambda x: C.broadcast(x, root=1, timeout=T),
    "allgather": lambda x: C.allgather(x, timeout=T),
    "reduce_scatter": lambda x: C.reduce_scatter(x, "sum", timeout=T),
    "reduce_scatter_mean": lambda x: C.reduce_scatter(x, "mean", timeout=T),
}


def _x(rank):
    return fl.constant(np.arange(10, dtype=np.float32).reshape(5, 2) * (rank + 1) + rank * 0.25)


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_the_collective_is_a_node_of_the_traced_graph_and_runs_as_eagerly(name):
    fn = COLLECTIVES[name]
    traced = fl.function(fn)

    def body(comm):
        x = _x(comm.rank)
        return fn(x).numpy(), traced(x).numpy(), [n.op.name for n in traced.get_concrete_function(x).graph.nodes]

    with LocalGroup(3) as group:
        results = group.run(body)
    op = name.split("_m")[0]
    for eager, got, ops in results:
        np.testing.assert_array_equal(got, eager)
        assert ops.count(op) == 1, ops


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_gradients_come_from_the_table_eager_and_traced_alike(name):
    fn = COLLECTIVES[name]
    assert get_op(name.split("_m")[0]).grad is not None

    def grads(x, w):
        with fl.GradientTape() as tape:
            tape.watch(x)
            y = fl.reduce_sum(fn(x * x) * w)
        return tape.gradient(y, x)

    traced = fl.function(grads)

    def body(comm):
        x = _x(comm.rank)
        w = fl.constant(np.random.default_rng(comm.rank).standard_normal(tuple(fn(x).shape)).astype(np.float32))
        return grads(x, w).numpy(), traced(x, w).numpy()

    with LocalGroup(3) as group:
        results = group.run(body)
    for eager, got in results:
        np.testing.assert_allclose(got, eager, rtol=1e-6)
    if name == "allreduce":     # d/dx_r sum(w_q * sum_s x_s^2) = 2 x_r * sum_q w_q
        ws = [np.random.default_rng(r).standard_normal((5, 2)).astype(np.float32) for r in range(3)]
        for r, (eager, _) in enumerate(results):
            np.testing.assert_allclose(eager, 2 * _x(r).numpy() * sum(ws), rtol=1e-5)


def test_numpy_inputs_skip_the_op_and_keep_their_type():
    with LocalGroup(2) as group:
        out = group.run(lambda comm: (C.allreduce(np.float32(comm.rank)), C.allreduce([1, 2]),
                                      C.allgather(comm.rank), C.allreduce(fl.constant(1.0))))
    for scalar, listed, gathered, tensor in out:
        assert type(scalar) is np.float32 and scalar == 1.0
        assert isinstance(listed, np.ndarray) and listed.tolist() == [2, 4]
        assert gathered.tolist() == [0, 1]
        assert isinstance(tensor, fl.Tensor) and float(tensor) == 2.0


def test_errors_through_the_op_keep_their_class_and_name_the_rank():
    with pytest.raises(ValueError, match="unknown algorithm 'spiral'"):
        with LocalGroup(2) as group:
            group.run(lambda comm: C.allreduce(fl.constant([1.0]), algorithm="spiral"))

    def body(comm):
        if comm.rank == 0:
            return C.allreduce(fl.constant([1.0]), timeout=0.5)
        return None

    with LocalGroup(2) as group:
        results = group.run(body, return_exceptions=True)
    err = results[0]
    assert isinstance(err, C.CollectiveTimeoutError) and isinstance(err, OpError)
    assert err.missing == [1] and "rank 0" in str(err)


def test_the_selectors_are_tried_in_their_documented_order():
    from flowlab.cluster.collectives import comm as comm_module
    assert [s.__name__ for s in C.SELECTORS] == ["_thread_scope", "_process_default", "_cluster_task",
                                                 "_mpi_world", "_group_of_one"]
    assert isinstance(C.current(), C.SelfCommunicator)          # nothing else applies here
    with LocalGroup(2) as group:
        mine = group[1]
        C.set_default(mine)
        try:
            assert C.current() is mine                          # 2. the process default beats 5.
            other = group[0]
            with C.use(other):
                assert C.current() is other                     # 1. the thread's scope beats 2.
            assert C.current() is mine
        finally:
            C.set_default(None)
    assert comm_module.current() is C.current()
