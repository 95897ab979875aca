"""MultiWorkerMirroredStrategy and flowlab.horovod across real LocalCluster worker processes:
the same model trained on 1 and on N processes ends with the same weights."""
import numpy as np
import pytest

import flowlab as fl
from _distribute_helpers import GLOBAL_BATCH, mlp_loss, mlp_variables, reference_weights, regression_data

pytestmark = pytest.mark.process


def train_strategy(seed=1, steps=3):
    """A custom loop under MultiWorkerMirroredStrategy (the default communicator)."""
    import flowlab as fl
    from flowlab import distribute as ds
    strategy = ds.MultiWorkerMirroredStrategy()
    x, y = regression_data()
    with strategy.scope():
        variables = mlp_variables(seed + strategy._worker)   # different on each worker: the first update syncs them
        opt = fl.optimizers.Adam(0.01)
    dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    def step(batch):
        with fl.GradientTape() as tape:
            loss = mlp_loss(variables, batch[0], batch[1])
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    losses = []
    for _ in range(steps):
        for batch in dist:
            losses.append(float(strategy.reduce("sum", strategy.run(step, args=(batch,)), axis=None).numpy()))
    return strategy.num_replicas_in_sync, [v.numpy() for v in variables], losses


def train_horovod(seed=1, steps=3):
    """The same model with flowlab.horovod: shard by rank, average gradients, broadcast from 0."""
    import flowlab as fl
    import flowlab.horovod as hvd
    hvd.init()
    x, y = regression_data()
    variables = mlp_variables(seed + hvd.rank())
    hvd.broadcast_variables(variables, root_rank=0)
    opt = hvd.DistributedOptimizer(fl.optimizers.Adam(0.01))
    per = GLOBAL_BATCH // hvd.size()
    for _ in range(steps):
        for start in range(0, len(x), GLOBAL_BATCH):
            lo = start + hvd.rank() * per
            with fl.GradientTape() as tape:
                loss = mlp_loss(variables, x[lo:lo + per], y[lo:lo + per], per)   # mean over the local batch
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return hvd.size(), hvd.rank(), [v.numpy() for v in variables]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_multi_worker_mirrored_matches_one_process(n):
    ref = reference_weights()
    with fl.cluster.LocalCluster(workers=n) as cluster:
        results = cluster.run(train_strategy, timeout=180)
    for replicas, weights, losses in results:
        assert replicas == n
        for a, b in zip(ref, weights):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
        assert losses == results[0][2]          # every worker reports the same global loss


def test_horovod_matches_one_process():
    ref = reference_weights()
    with fl.cluster.LocalCluster(workers=3) as cluster:
        results = cluster.run(train_horovod, timeout=180)
    assert [(s, r) for s, r, _ in results] == [(3, 0), (3, 1), (3, 2)]
    for _, _, weights in results:
        for a, b in zip(ref, weights):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
