"""Custom training loops that recover by themselves, on real LocalCluster workers driven by
fl.distribute.run_with_recovery, which restarts a worker that dies mid-training and runs the
training function again on every worker:

- hvd.elastic: the state is committed in memory after every step (or every k); the surviving
  worker keeps its commit, the restarted one has none, and the next try's sync hands the newest
  commit to every rank, also when the lost worker is rank 0.
- MultiWorkerMirroredStrategy with fl.train.Checkpoint/CheckpointManager: the chief saves every
  few steps, every worker restores the latest checkpoint at the start of each try.

Each ends with the weights of a run that was never interrupted, bit for bit. The worker dies by
its own hand (os._exit) at a chosen step of the first try (a marker file says it already did), so
the point of death is the same on every run."""
import logging
import os

import numpy as np
import pytest

import flowlab as fl
from _distribute_helpers import GLOBAL_BATCH, mlp_loss, mlp_variables, regression_data

pytestmark = pytest.mark.process

ROWS, STEPS = 48, 12          # global batches of 12 (6 rows a worker): 4 steps an epoch, 3 epochs


def _die_here(marker, rank, step, lose):
    """Exit (code 3) when ``lose == (rank, step)`` and ``marker`` does not exist yet."""
    if lose is not None and (rank, step) == tuple(lose) and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)


def train_elastic(marker=None, lose=None, commit_every=1, steps=STEPS, pause=0.0):
    """hvd.elastic over a Keras model, SGD with momentum; returns (weights, step the last try
    started at, reset callbacks run, pid). ``pause``: seconds to sleep after each step."""
    import time
    import flowlab as fl
    import flowlab.horovod as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    fl.random.set_seed(100 + rank)                      # different weights on each worker: the sync equalizes
    model = fl.keras.Sequential([fl.keras.Input(shape=(5,)), fl.keras.layers.Dense(8, activation="relu"),
                                 fl.keras.layers.Dense(1)])
    opt = fl.optimizers.SGD(0.05, momentum=0.9)
    x, y = regression_data(ROWS)
    per = GLOBAL_BATCH // size
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.step)])

    @hvd.elastic.run
    def loop(state):
        started = state.step
        while state.step < steps:
            k = state.step
            _die_here(marker, rank, k, lose)
            time.sleep(pause)
            lo = (k * GLOBAL_BATCH) % ROWS + rank * per
            with fl.GradientTape() as tape:
                loss = fl.reduce_mean((model(x[lo:lo + per]) - y[lo:lo + per]) ** 2)
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            state.step = k + 1
            if state.step % commit_every == 0:
                state.commit()
        return started

    started = loop(state)
    return [v.numpy() for v in model.variables], started, resets, os.getpid()


def test_hvd_elastic_resumes_from_the_survivors_commit(make_cluster, tmp_path, caplog):
    cluster = make_cluster(workers=2)
    clean = fl.distribute.run_with_recovery(cluster, train_elastic, timeout=120)
    assert clean.restarts == [] and [r[1] for r in clean] == [0, 0] and [r[2] for r in clean] == [[], []]
    reference = clean[0][0]
    for a, b in zip(reference, clean[1][0]):
        np.testing.assert_array_equal(a, b)

    for n, (lose, commit_every) in enumerate([((1, 5), 1), ((0, 7), 3)]):   # rank 0 lost: rank 1 holds the commit
        old_pid = cluster.pid(lose[0])
        marker = str(tmp_path / f"died{n}")
        with caplog.at_level(logging.WARNING, logger="flowlab.distribute"):
            results = fl.distribute.run_with_recovery(cluster, train_elastic, marker, lose, commit_every,
                                                      max_restarts=2, timeout=120)
        assert os.path.exists(marker)
        [restart] = results.restarts
        assert restart.task == f"/job:worker/task:{lose[0]}" and restart.pid == old_pid
        assert "exit code 3" in restart.reason
        committed = lose[1] // commit_every * commit_every
        for weights, started, resets, pid in results:
            assert started == committed and resets == [committed]      # every rank resumed the same commit
            for a, b in zip(reference, weights):
                np.testing.assert_array_equal(b, a)                     # bit for bit the clean run's weights
        assert results[lose[0]][3] == cluster.pid(lose[0]) != old_pid


def train_checkpointed(directory, marker=None, lose=None, save_every=2):
    """A custom loop under MultiWorkerMirroredStrategy: the chief saves (model, optimizer, step)
    every ``save_every`` steps with a CheckpointManager, every worker restores the latest
    checkpoint first. Returns (weights, step it started at, the checkpoint restored, pid)."""
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    rank, chief = strategy.worker_index, strategy.worker_index == 0
    x, y = regression_data(ROWS)
    per = GLOBAL_BATCH // strategy.num_replicas_in_sync
    with strategy.scope():
        variables = mlp_variables(1 + rank)             # worker 0's values on every worker (the scope broadcasts)
        opt = fl.optimizers.SGD(0.1, momentum=0.9)
    step = fl.Variable(0, dtype=fl.int64)
    w1, b1, w2 = variables
    checkpoint = fl.train.Checkpoint(w1=w1, b1=b1, w2=w2, optimizer=opt, step=step)
    latest = fl.train.latest_checkpoint(directory)      # nobody writes until every worker took a step
    if latest is not None:
        checkpoint.restore(latest)
    manager = fl.train.CheckpointManager(checkpoint, directory, max_to_keep=2) if chief else None

    def replica_step(xb, yb):
        with fl.GradientTape() as tape:
            loss = mlp_loss(variables, xb, yb)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    started = int(step.numpy())
    while int(step.numpy()) < STEPS:
        k = int(step.numpy())
        _die_here(marker, rank, k, lose)
        lo = (k * GLOBAL_BATCH) % ROWS + rank * per
        strategy.run(replica_step, args=(x[lo:lo + per], y[lo:lo + per]))
        step.assign_add(1)
        if chief and (k + 1) % save_every == 0:
            manager.save(checkpoint_number=k + 1)
    return [v.numpy() for v in variables], started, latest and os.path.basename(latest), os.getpid()


def test_custom_loop_with_a_checkpoint_recovers(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    clean = fl.distribute.run_with_recovery(cluster, train_checkpointed, str(tmp_path / "clean"), timeout=120)
    assert clean.restarts == [] and [r[1] for r in clean] == [0, 0]
    reference = clean[0][0]

    for n, lose in enumerate([(1, 5), (0, 8)]):          # a worker, then the chief (the writer) itself
        marker, directory = str(tmp_path / f"died{n}"), str(tmp_path / f"ckpt{n}")
        results = fl.distribute.run_with_recovery(cluster, train_checkpointed, directory, marker, lose,
                                                  max_restarts=2, timeout=120)
        [restart] = results.restarts
        assert restart.task == f"/job:worker/task:{lose[0]}" and "exit code 3" in restart.reason
        saved = lose[1] // 2 * 2
        for weights, started, restored, _ in results:
            assert started == saved and restored == f"ckpt-{saved}"
            for a, b in zip(reference, weights):
                np.testing.assert_array_equal(b, a)


def test_a_worker_killed_from_outside_at_any_moment(make_cluster):
    """SIGKILL on a timer, wherever the worker is (in a collective, a commit, a sleep): the survivor
    fails or is cancelled, keeps its commit, and the retry still ends on the clean run's weights."""
    cluster = make_cluster(workers=2)
    clean = fl.distribute.run_with_recovery(cluster, train_elastic, None, None, 1, 40, 0.05, timeout=120)
    assert clean.restarts == []
    fault = cluster.schedule_fault(1.0, "kill", 1)
    results = fl.distribute.run_with_recovery(cluster, train_elastic, None, None, 1, 40, 0.05,
                                              max_restarts=2, timeout=120)
    assert fault.done and fault.error is None
    [restart] = results.restarts
    assert restart.task == "/job:worker/task:1" and "SIGKILL" in restart.reason, restart
    assert results[0][1] == results[1][1] and results[0][2] == results[1][2] == [results[0][1]]
    for weights, *_ in results:
        for a, b in zip(clean[0][0], weights):
            np.testing.assert_array_equal(b, a)
