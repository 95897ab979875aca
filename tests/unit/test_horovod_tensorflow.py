"""flowlab.horovod's TensorFlow side in one process, ranks on threads of a LocalGroup:
DistributedGradientTape (eager and inside @fl.function), broadcast_variables inside a traced step
under a Python flag, hvd.allreduce/allgather/broadcast on tensors inside @fl.function, the names
Horovod programs call (local_size, cross_rank, ..., elastic), Adagrad, and the errors for what
flowlab leaves out. The real-process runs are in tests/process/test_horovod_custom_loop.py."""
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


RNG = np.random.default_rng(3)
X = RNG.normal(size=(16, 4)).astype(np.float32)
Y = RNG.normal(size=(16, 3)).astype(np.float32)


def _variables(seed):
    rng = np.random.default_rng(seed)
    return [fl.Variable(rng.normal(size=(4, 3)).astype(np.float32)), fl.Variable(np.zeros(3, np.float32))]


def _loss(variables, x, y):
    err = fl.matmul(x, variables[0]) + variables[1] - y
    return fl.reduce_mean(err * err)


def _tape_program(traced, op=hvd.Average, compression=hvd.Compression.none, steps=3):
    """The custom loop as Horovod's TF2 example has it: tape wrapped after the `with`, a plain
    optimizer, the broadcast after the first step's update (every rank starts elsewhere)."""
    hvd.init()
    variables = _variables(hvd.rank())
    opt = fl.optimizers.Adam(0.01 * hvd.size())
    per = len(X) // hvd.size()
    x, y = X[hvd.rank() * per:(hvd.rank() + 1) * per], Y[hvd.rank() * per:(hvd.rank() + 1) * per]

    def training_step(images, labels, first_batch):
        with fl.GradientTape() as tape:
            loss_value = _loss(variables, images, labels)
        tape = hvd.DistributedGradientTape(tape, op=op, compression=compression)
        grads = tape.gradient(loss_value, variables)
        opt.apply_gradients(zip(grads, variables))
        if first_batch:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss_value

    step = fl.function(training_step) if traced else training_step
    for batch in range(steps):
        step(fl.constant(x), fl.constant(y), batch == 0)
    traces = step.experimental_get_tracing_count() if traced else None
    return [v.numpy() for v in variables], int(opt.iterations.numpy()), traces


def _reference(steps=3, n=2, scale=1.0):
    """One process: the first step applies, to rank 0's start, the mean of each rank's gradient at
    its own start; later steps the gradient of the whole batch (the mean of the ranks' means)."""
    starts = [_variables(r) for r in range(n)]
    opt = fl.optimizers.Adam(0.01 * n)
    per = len(X) // n
    first = []
    for r in range(n):
        with fl.GradientTape() as tape:
            loss = _loss(starts[r], X[r * per:(r + 1) * per], Y[r * per:(r + 1) * per])
        first.append(tape.gradient(loss, starts[r]))
    variables = starts[0]
    opt.apply_gradients(zip([scale * sum(g[i] for g in first) / n for i in range(2)], variables))
    for _ in range(steps - 1):
        with fl.GradientTape() as tape:
            loss = _loss(variables, X, Y)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip([scale * g for g in grads], variables))
    return [v.numpy() for v in variables]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_distributed_gradient_tape_program_matches_one_process(traced):
    with LocalGroup(2) as group:
        (w0, it0, traces), (w1, it1, _) = group.run(lambda comm: _tape_program(traced))
    assert it0 == it1 == 3
    if traced:
        assert traces == 2              # first_batch True, then False: two graphs, as in TensorFlow
    for a, b in zip(w0, w1):
        np.testing.assert_array_equal(a, b)     # the broadcast, then the same averaged gradients
    for a, b in zip(_reference(), w0):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_traced_and_eager_tape_give_the_same_bits():
    with LocalGroup(2) as group:
        eager = group.run(lambda comm: _tape_program(False))
    with LocalGroup(2) as group:
        traced = group.run(lambda comm: _tape_program(True))
    for a, b in zip(eager[0][0], traced[0][0]):
        np.testing.assert_array_equal(a, b)


def test_tape_sum_and_fp16_compression():
    with LocalGroup(2) as group:
        (summed, _, _), _ = group.run(lambda comm: _tape_program(True, op=hvd.Sum))
    for a, b in zip(_reference(scale=2.0), summed):          # the sum is twice the mean
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    with LocalGroup(2) as group:
        (h0, _, _), (h1, _, _) = group.run(lambda comm: _tape_program(True, compression=hvd.Compression.fp16))
    for a, b, c in zip(h0, h1, _reference()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-2, atol=1e-2)


def test_tape_gradient_keeps_the_structure_and_nones():
    def rank_fn(comm):
        hvd.init()
        a, b, unused = fl.Variable([1.0 + hvd.rank()]), fl.Variable([2.0]), fl.Variable([0.0])
        with fl.GradientTape(persistent=True) as tape:
            loss = fl.reduce_sum(a * b)
        tape = hvd.DistributedGradientTape(tape)
        as_dict = tape.gradient(loss, {"a": a, "b": b})
        as_list = tape.gradient(loss, [a, unused])
        single = tape.gradient(loss, b)
        return ({k: v.numpy().tolist() for k, v in as_dict.items()}, as_list[0].numpy().tolist(), as_list[1],
                single.numpy().tolist())

    with LocalGroup(2) as group:
        out = group.run(rank_fn)
    # d/da = b = 2 on both ranks; d/db = a = 1 on rank 0, 2 on rank 1: the average is 1.5
    assert out[0] == out[1] == ({"a": [2.0], "b": [1.5]}, [2.0], None, [1.5])


def test_collectives_on_tensors_inside_fl_function():
    def rank_fn(comm):
        hvd.init()
        r = float(hvd.rank())

        @fl.function
        def step(x):
            return (hvd.allreduce(x), hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Max),
                    hvd.allgather(x), hvd.broadcast(x, root_rank=2), hvd.allreduce(x, average=False))

        first = [t.numpy().tolist() for t in step(fl.constant([r, 10.0 * r]))]
        again = [t.numpy().tolist() for t in step(fl.constant([r + 1, 0.0]))]        # the same graph, new values
        return first, again, step.experimental_get_tracing_count()

    with LocalGroup(3) as group:
        out = group.run(rank_fn)
    for first, again, traces in out:
        assert traces == 1
        assert first == [[1.0, 10.0], [3.0, 30.0], [2.0, 20.0], [0.0, 0.0, 1.0, 10.0, 2.0, 20.0], [2.0, 20.0],
                         [3.0, 30.0]]
        assert again == [[2.0, 0.0], [6.0, 0.0], [3.0, 0.0], [1.0, 0.0, 2.0, 0.0, 3.0, 0.0], [3.0, 0.0],
                         [6.0, 0.0]]


def test_eager_tensor_collectives_keep_the_tensor_type():
    def rank_fn(comm):
        hvd.init()
        x = fl.constant([float(hvd.rank())])
        out = hvd.allreduce(x, prescale_factor=2.0, postscale_factor=0.5)
        return type(out).__name__, out.numpy().tolist(), type(hvd.broadcast(x, 1)).__name__

    with LocalGroup(2) as group:
        assert group.run(rank_fn) == [("Tensor", [0.5], "Tensor")] * 2


def test_broadcast_variables_inside_fl_function_runs_when_the_graph_runs():
    def rank_fn(comm):
        hvd.init()
        v = fl.Variable([float(hvd.rank()), 5.0])
        n = fl.Variable(hvd.rank(), dtype=fl.int64)

        @fl.function
        def sync():
            v.assign_add([1.0, 1.0])                    # before the broadcast: root's update is what is sent
            hvd.broadcast_variables([v, n], root_rank=1)

        before = v.numpy().tolist()
        sync()
        return before, v.numpy().tolist(), int(n.numpy())

    with LocalGroup(2) as group:
        out = group.run(rank_fn)
    assert out == [([0.0, 5.0], [2.0, 6.0], 1), ([1.0, 5.0], [2.0, 6.0], 1)]


def test_names_horovod_programs_call():
    assert not hvd.is_initialized()
    hvd.init()
    assert hvd.is_initialized()
    assert (hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous()) == (1, 0, 1, True)
    assert hvd.mpi_threads_supported() is False       # no mpiexec here
    assert hvd.nccl_built() is False and hvd.gloo_built() is False and hvd.cuda_built() is False
    assert hvd.mpi_enabled() is False
    import importlib.util
    assert hvd.mpi_built() == (importlib.util.find_spec("mpi4py") is not None)
    assert hvd.join() == 0
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
        hvd.size()

    def rank_fn(comm):
        hvd.init()
        got = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), hvd.join())
        return got

    with LocalGroup(2) as group:
        assert group.run(rank_fn) == [(0, 2, 0, 1, 0), (1, 2, 0, 1, 0)]


def test_spellings_and_what_is_left_out():
    import flowlab.horovod.tensorflow as hvd_tf
    import flowlab.horovod.tensorflow.keras as hvd_tfk
    assert hvd_tf.DistributedGradientTape is hvd.DistributedGradientTape
    assert hvd_tfk.broadcast_variables is hvd.broadcast_variables
    assert hvd_tf.BroadcastGlobalVariablesHook is hvd.BroadcastGlobalVariablesHook
    assert hvd_tf.elastic.run is hvd.elastic.run           # elastic: flowlab/horovod/_elastic.py
    for name in ("KerasState", "HostsUpdatedInterrupt"):  # ranks that join and leave: not in flowlab
        with pytest.raises(AttributeError, match="is not in flowlab: a group's ranks do not change while training") as e:
            getattr(hvd.elastic, name)
        assert type(e.value).__name__ == "NotInFlowlabError"
    with pytest.raises(AttributeError, match="did you mean 'broadcast_variables'"):
        hvd.broadcast_variable                            # noqa: B018


def test_errors_name_the_call_and_what_to_do():
    hvd.init()
    with fl.GradientTape() as tape:
        pass
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedGradientTape(tape, op=hvd.Adasum)
    with pytest.raises(TypeError, match="wraps a fl.GradientTape"):
        hvd.DistributedGradientTape(object())
    with pytest.raises(ValueError, match="distributed already"):
        hvd.DistributedGradientTape(hvd.DistributedGradientTape(tape))
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(fl.constant([1.0]), op=hvd.Adasum)
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(fl.constant([1.0]), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match=r"root_rank must be a rank of this group of 1 \(0..0\), got 1"):
        hvd.broadcast_variables([fl.Variable(1.0)], root_rank=1)
    with pytest.raises(TypeError, match="pass model.variables"):
        hvd.broadcast_variables([fl.constant(1.0)])


def test_adagrad_follows_its_formula():
    v = fl.Variable(np.array([1.0, -2.0], np.float32))
    opt = fl.optimizers.get("adagrad")
    assert isinstance(opt, fl.optimizers.Adagrad)
    opt = fl.optimizers.Adagrad(0.1, initial_accumulator_value=0.5, epsilon=0.0)
    g = np.array([0.3, -0.4], np.float32)
    accum = np.full(2, 0.5, np.float32)
    expect = v.numpy().copy()
    for _ in range(2):
        opt.apply_gradients([(fl.constant(g), v)])
        accum = accum + g * g
        expect = expect - np.float32(0.1) * g / np.sqrt(accum)
    np.testing.assert_allclose(v.numpy(), expect, rtol=1e-6)
    np.testing.assert_allclose(opt.get_slot(v, "accumulator").numpy(), accum, rtol=1e-6)
