"""Auto-sharding on real worker processes: MultiWorkerMirroredStrategy on a 2-worker LocalCluster
reading record files from a temporary folder. FILE: each worker reads only its own files (checked
from what it trained on) and training still converges; AUTO: the weights equal one process's;
OFF: each worker trains on all of its own batches, with one warning."""
import os

import numpy as np
import pytest

import flowlab as fl

pytestmark = pytest.mark.process
FILES, PER_FILE, GLOBAL_BATCH, EPOCHS, LR = 4, 12, 6, 8, 0.05
TRUE_W = np.array([[1.5], [-2.0], [0.5]], np.float32)


def _write(folder):
    """FILES record files; every record has features x, y = x @ TRUE_W + 0.25 and f (its file's number)."""
    rng = np.random.default_rng(0)
    for f in range(FILES):
        with fl.data.RecordWriter(os.path.join(folder, f"train-{f}.flrec")) as w:
            for _ in range(PER_FILE):
                x = rng.normal(size=3).astype(np.float32)
                w.write({"x": x, "y": (x @ TRUE_W + 0.25).astype(np.float32), "f": np.array(f, np.int64)})


def _pipeline(folder, policy):
    import flowlab as fl
    options = fl.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return (fl.data.Dataset.list_files(os.path.join(folder, "*.flrec"), shuffle=False)
            .interleave(lambda path: fl.data.RecordDataset(path, decode=True), cycle_length=2)
            .map(lambda e: (e["x"], e["y"], e["f"]))
            .batch(GLOBAL_BATCH).with_options(options))


def _loss(w, b, x, y):
    import flowlab as fl
    err = fl.matmul(x, w) + b - y
    return fl.reduce_sum(err * err) / GLOBAL_BATCH


def train(folder, policy_name):
    """On every worker: EPOCHS epochs of SGD under MultiWorkerMirroredStrategy. Returns the worker's
    index, the file numbers it trained on, the global loss of every step, its weights and warnings."""
    import warnings

    import flowlab as fl
    strategy = fl.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = fl.Variable(np.zeros((3, 1), np.float32))
        b = fl.Variable(np.zeros(1, np.float32))
        opt = fl.optimizers.SGD(LR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = strategy.experimental_distribute_dataset(_pipeline(folder, fl.data.AutoShardPolicy[policy_name]))
    seen, losses = [], []

    def step(x, y, f):
        seen.extend(np.asarray(f.numpy()).ravel().tolist())
        with fl.GradientTape() as tape:
            loss = _loss(w, b, x, y)
        opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
        return loss

    for _ in range(EPOCHS):
        for batch in dist:
            losses.append(float(strategy.reduce("sum", strategy.run(step, args=batch), axis=None).numpy()))
    return (strategy.worker_index, sorted(set(seen)), len(seen), losses, [w.numpy(), b.numpy()],
            [str(c.message) for c in caught])


def _reference(folder):
    """One process, no strategy: the same global batches, the same SGD."""
    w, b = fl.Variable(np.zeros((3, 1), np.float32)), fl.Variable(np.zeros(1, np.float32))
    opt = fl.optimizers.SGD(LR)
    for _ in range(EPOCHS):
        for x, y, _f in _pipeline(folder, fl.data.AutoShardPolicy.AUTO):
            with fl.GradientTape() as tape:
                loss = _loss(w, b, x, y)
            opt.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))
    return [w.numpy(), b.numpy()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("records")
    _write(str(path))
    return str(path)


@pytest.fixture(scope="module")
def cluster():
    with fl.cluster.LocalCluster(workers=2) as c:
        yield c


def test_file_policy_each_worker_reads_only_its_files_and_training_converges(cluster, folder):
    results = cluster.run(train, folder, "FILE", timeout=180)
    steps = EPOCHS * FILES * PER_FILE // GLOBAL_BATCH
    for worker, (index, files, count, losses, weights, caught) in enumerate(results):
        assert index == worker
        assert files == list(range(worker, FILES, 2))          # sorted files worker, worker + 2
        assert count == EPOCHS * FILES * PER_FILE // 2         # half of every epoch's records
        assert len(losses) == steps and not caught
        assert losses[-1] < 0.05 * losses[0]                   # it learns y = x @ TRUE_W + 0.25
    np.testing.assert_allclose(results[0][4][0], TRUE_W, atol=0.3)
    for a, b in zip(results[0][4], results[1][4]):             # the replicas stay in sync
        np.testing.assert_array_equal(a, b)
    assert results[0][3] == results[1][3]                      # and report the same global losses


def test_auto_policy_weights_equal_one_process(cluster, folder):
    ref = _reference(folder)
    results = cluster.run(train, folder, "AUTO", timeout=180)
    for worker, (_, files, count, losses, weights, caught) in enumerate(results):
        assert files == list(range(FILES))                     # AUTO: slices of every global batch
        assert count == EPOCHS * FILES * PER_FILE // 2 and not caught
        for a, b in zip(ref, weights):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)


def test_off_policy_warns_and_each_worker_trains_on_all_its_batches(cluster, folder):
    results = cluster.run(train, folder, "OFF", timeout=180)
    for _, files, count, losses, weights, caught in results:
        assert files == list(range(FILES)) and count == EPOCHS * FILES * PER_FILE   # all of it, on each
        assert len(caught) == 1 and "AutoShardPolicy.OFF" in caught[0] and "same data" in caught[0]
