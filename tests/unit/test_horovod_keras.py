"""flowlab.horovod's Keras side in one process, ranks on threads of a LocalGroup: the traced
gradient all-reduce of DistributedOptimizer (a custom @fl.function step and Model.fit's step)
against the eager one, fp16 compression, the callbacks (metric average, learning-rate schedule
and warm-up), the Horovod spellings of the module, and the errors for what is not supported.
The real-process runs are in tests/process/test_horovod_fit.py."""
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


RNG = np.random.default_rng(1)
X = RNG.normal(size=(16, 4)).astype(np.float32)
Y = RNG.normal(size=(16, 3)).astype(np.float32)


def _variables():
    rng = np.random.default_rng(7)
    return [fl.Variable(rng.normal(size=(4, 3)).astype(np.float32)), fl.Variable(np.zeros(3, np.float32))]


def _loss(variables, x, y):
    err = fl.matmul(x, variables[0]) + variables[1] - y
    return fl.reduce_mean(err * err)


def _train(traced, compression=hvd.Compression.none, steps=3):
    """Each rank: its quarter... of X, Y; `steps` DistributedOptimizer(Adam) steps, eager or traced."""
    hvd.init()
    variables = _variables()
    opt = hvd.DistributedOptimizer(fl.optimizers.Adam(0.05), compression=compression)
    per = len(X) // hvd.size()
    x, y = X[hvd.rank() * per:(hvd.rank() + 1) * per], Y[hvd.rank() * per:(hvd.rank() + 1) * per]

    def step(x, y):
        with fl.GradientTape() as tape:
            loss = _loss(variables, x, y)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    run = fl.function(step) if traced else step
    for _ in range(steps):
        run(fl.constant(x), fl.constant(y))
    names = [n.op.name for n in run.get_concrete_function(fl.constant(x), fl.constant(y)).graph.nodes] \
        if traced else []
    return [v.numpy() for v in variables], names


@pytest.mark.parametrize("n", [2, 4])
def test_traced_distributed_optimizer_is_one_allreduce_node_with_the_eager_bits(n):
    with LocalGroup(n) as group:
        eager = group.run(lambda comm: _train(False))
    with LocalGroup(n) as group:
        traced = group.run(lambda comm: _train(True))
    for (we, _), (wt, names) in zip(eager, traced):
        assert names.count("allreduce") == 1
        for a, b in zip(we, wt):
            np.testing.assert_array_equal(a, b)
    # and both equal one process on the whole batch
    variables, opt = _variables(), fl.optimizers.Adam(0.05)
    for _ in range(3):
        with fl.GradientTape() as tape:
            loss = _loss(variables, X, Y)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    for a, b in zip(variables, traced[0][0]):
        np.testing.assert_allclose(b, a.numpy(), rtol=2e-5, atol=2e-6)


def test_fp16_compression_sends_half_floats_and_stays_close():
    with LocalGroup(2) as group:
        plain = group.run(lambda comm: _train(True))
    with LocalGroup(2) as group:
        half = group.run(lambda comm: _train(True, hvd.Compression.fp16))
    for a, b in zip(plain[0][0], half[0][0]):
        np.testing.assert_allclose(b, a, rtol=0, atol=5e-3)
    assert any(not np.array_equal(a, b) for a, b in zip(plain[0][0], half[0][0]))    # it did round
    for a, b in zip(half[0][0], half[1][0]):
        np.testing.assert_array_equal(a, b)


def _model():
    # The ranks are threads of one process: fl.random's seed is shared by them, so which rank draws
    # first would change rank 0's start from run to run. Fixed weights, drawn per call, keep it fixed.
    model = fl.keras.Sequential([fl.keras.Input(shape=(4,)), fl.keras.layers.Dense(3)])
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def test_fit_traced_with_distributed_optimizer_on_threads_matches_eager_fit():
    def rank_fn(comm, run_eagerly):
        hvd.init()
        model = _model()
        model.compile(optimizer=hvd.DistributedOptimizer(fl.optimizers.SGD(0.1 * hvd.size())), loss="mse",
                      run_eagerly=run_eagerly, experimental_run_tf_function=False)
        shard = slice(hvd.rank(), None, hvd.size())
        model.fit(X[shard], Y[shard], batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        return [w.numpy() for w in model.weights]

    with LocalGroup(2) as group:
        eager = group.run(lambda comm: rank_fn(comm, True))
    with LocalGroup(2) as group:
        traced = group.run(lambda comm: rank_fn(comm, False))
    for a, b in zip(eager[0], traced[0]):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    for a, b in zip(traced[0], traced[1]):
        np.testing.assert_array_equal(a, b)


def test_metric_average_callback_averages_every_number_over_the_ranks():
    def rank_fn(comm):
        hvd.init()
        logs = {"loss": 1.0 + hvd.rank(), "accuracy": np.float32(0.5 * hvd.rank()), "note": "text"}
        hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
        return logs

    with LocalGroup(2) as group:
        a, b = group.run(rank_fn)
    assert a == b == {"loss": 1.5, "accuracy": 0.25, "note": "text"}


def test_learning_rate_warmup_and_schedule_set_the_rate_per_batch_or_per_epoch():
    def rank_fn(comm):
        hvd.init()
        model = _model()
        model.compile(optimizer=hvd.DistributedOptimizer(fl.optimizers.SGD(0.4)), loss="mse")
        seen = []
        record = fl.keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs: seen.append(float(model.optimizer.learning_rate)))
        warm = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
        history = model.fit(X, Y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[warm, record])
        halve = hvd.callbacks.LearningRateScheduleCallback(0.4, lambda epoch: 0.5 ** epoch, start_epoch=1)
        seen2 = []
        record2 = fl.keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: seen2.append(float(model.optimizer.learning_rate)))
        model.optimizer.learning_rate = 0.4
        model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[halve, record2])
        return seen, history.history["lr"], seen2

    with LocalGroup(2) as group:
        (seen, lr, seen2), _ = group.run(rank_fn)
    # 2 ranks: from 0.4 / 2 up to 0.4 over 2 epochs of 2 batches, then 0.4
    np.testing.assert_allclose(seen, [0.2, 0.25, 0.3, 0.35, 0.4, 0.4], rtol=1e-12)
    np.testing.assert_allclose(lr, [0.25, 0.4, 0.4], rtol=1e-12)
    np.testing.assert_allclose(seen2, [0.4, 0.2, 0.1], rtol=1e-12)


def test_the_horovod_spellings_of_the_module():
    import flowlab.horovod.keras as hk
    import flowlab.horovod.tensorflow as ht
    import flowlab.horovod.tensorflow.keras as htk
    for mod in (hk, ht, htk):
        assert mod.DistributedOptimizer is hvd.DistributedOptimizer and mod.init is hvd.init
        assert mod.callbacks.BroadcastGlobalVariablesCallback is hvd.callbacks.BroadcastGlobalVariablesCallback
        assert mod.callbacks.LearningRateWarmupCallback is hvd.callbacks.LearningRateWarmupCallback
    assert fl.horovod is hvd


def test_what_is_not_supported_says_so():
    hvd.init()
    opt = fl.optimizers.SGD(0.1)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(opt, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="backward_passes_per_step=2.*larger batch"):
        hvd.DistributedOptimizer(opt, backward_passes_per_step=2)
    with pytest.raises(ValueError, match="distributed already"):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(opt))
    with pytest.raises(ValueError, match="root_rank 3 is not a rank"):
        model = _model()
        model.compile(optimizer="sgd", loss="mse")
        model.fit(X, Y, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(3)])
    with pytest.raises(ValueError, match="initial_lr must be a number"):
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=None)
