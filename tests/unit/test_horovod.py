"""flowlab.horovod in one process: alone (size 1) and as ranks on threads of a LocalGroup."""
import numpy as np
import pytest

import flowlab as fl
import flowlab.horovod as hvd
from flowlab.cluster.collectives import LocalGroup


@pytest.fixture(autouse=True)
def fresh():
    hvd.shutdown()
    yield
    hvd.shutdown()


def test_alone_is_a_group_of_one():
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.rank()
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    np.testing.assert_array_equal(hvd.allreduce(np.array([1.0, 2.0])), [1.0, 2.0])
    opt = hvd.DistributedOptimizer(fl.optimizers.SGD(0.5))
    assert isinstance(opt, fl.optimizers.SGD) and fl.optimizers.get(opt) is opt
    v = fl.Variable([1.0])
    opt.apply_gradients([(fl.constant([1.0]), v)])
    assert v.numpy().tolist() == [0.5]


def _model(seed):
    rng = np.random.default_rng(seed)
    return [fl.Variable(rng.normal(size=(4, 3)).astype(np.float32)), fl.Variable(np.zeros(3, np.float32))]


def _grads(variables, x, y):
    with fl.GradientTape() as tape:
        err = fl.matmul(x, variables[0]) + variables[1] - y
        loss = fl.reduce_mean(err * err)
    return tape.gradient(loss, variables)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_distributed_optimizer_on_n_ranks_matches_one(n):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 4)).astype(np.float32)
    y = rng.normal(size=(12, 3)).astype(np.float32)
    def rank_fn(comm):
        hvd.init()
        variables = _model(hvd.rank())                  # different on every rank...
        hvd.broadcast_variables(variables, root_rank=0)  # ...until rank 0's (seed 0) are broadcast
        dopt = hvd.DistributedOptimizer(fl.optimizers.Adam(0.05))
        per = len(x) // hvd.size()
        lo = hvd.rank() * per
        for _ in range(4):
            dopt.apply_gradients(zip(_grads(variables, x[lo:lo + per], y[lo:lo + per]), variables))
        return [v.numpy() for v in variables]

    base = _model(0)
    opt0 = fl.optimizers.Adam(0.05)
    for _ in range(4):
        opt0.apply_gradients(zip(_grads(base, x, y), base))
    with LocalGroup(n) as group:
        results = group.run(rank_fn)
    for weights in results:
        for a, b in zip(base, weights):
            np.testing.assert_allclose(b, a.numpy(), rtol=2e-5, atol=2e-6)


def test_allreduce_allgather_broadcast_on_threads():
    def rank_fn(comm):
        hvd.init()
        r = hvd.rank()
        return (hvd.allreduce(np.array([float(r)])).tolist(), hvd.allreduce(np.array([r]), op=hvd.Sum).tolist(),
                hvd.allgather(np.array([r, r])).tolist(), hvd.broadcast(np.array([r]), root_rank=2).tolist())

    with LocalGroup(3) as group:
        out = group.run(rank_fn)
    assert out == [([1.0], [3], [0, 0, 1, 1, 2, 2], [2])] * 3


def test_broadcast_callback_syncs_a_model_at_train_begin():
    def rank_fn(comm):
        hvd.init()
        variables = _model(hvd.rank())
        cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0)

        class M:      # what fit hands a callback: an object with .variables
            pass
        m = M()
        m.variables = variables
        cb.set_model(m) if hasattr(cb, "set_model") else setattr(cb, "model", m)
        cb.on_train_begin()
        return [v.numpy() for v in variables]

    with LocalGroup(2) as group:
        a, b = group.run(rank_fn)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_init_on_a_ranks_thread_leaves_the_process_group_alone():
    """hvd.init() on a LocalGroup rank's thread joins that thread's rank only: the main thread, which
    never called init(), is not initialized afterwards (it used to see a closed rank's group)."""
    with LocalGroup(3) as group:
        def rank_fn(comm):
            hvd.init()
            return (hvd.rank(), hvd.size())
        assert group.run(rank_fn) == [(0, 3), (1, 3), (2, 3)]
    assert not hvd.is_initialized()
    hvd.init()
    assert hvd.size() == 1
