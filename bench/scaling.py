#!/usr/bin/env python
"""Data-parallel scaling: the same MLP trained with MultiWorkerMirroredStrategy on 1, 2 (and with
--workers, more) LocalCluster worker processes, at a fixed *global* batch.

    python bench/scaling.py            # 1 and 2 workers
    python bench/scaling.py --quick    # smoke run: few steps

Each worker runs the custom training loop (GradientTape, strategy.run, apply_gradients, whose
gradients are summed with a ring all-reduce over ZeroMQ). The figure per row is the median over
steps of the slowest worker's step time; throughput = global batch / that time; scaling
efficiency = throughput(N) / (N * throughput(1)). On a machine with fewer free cores than
workers, efficiency below 1/N only says the workers share cores. Before timing, the row checks
that every worker ends with the same weights (exit status 1 if not); timings never fail it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as Cm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def train(global_batch, hidden, steps, warmup):
    """One worker's loop; returns its per-step seconds and its final weights."""
    import flowlab as fl
    from flowlab import distribute as ds

    strategy = ds.MultiWorkerMirroredStrategy(timeout=600)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch, 64)).astype(np.float32)
    y = rng.normal(size=(global_batch, 1)).astype(np.float32)
    with strategy.scope():
        w1 = fl.Variable(rng.normal(size=(64, hidden)).astype(np.float32) * 0.05)
        w2 = fl.Variable(rng.normal(size=(hidden, 1)).astype(np.float32) * 0.05)
        opt = fl.optimizers.SGD(0.01)
    batch = next(iter(strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensors((x, y)))))
    variables = [w1, w2]

    def step(b):
        with fl.GradientTape() as tape:
            err = fl.matmul(fl.nn.relu(fl.matmul(b[0], w1)), w2) - b[1]
            loss = ds.compute_average_loss(fl.reduce_sum(err * err, axis=1), global_batch_size=global_batch)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    times = []
    for i in range(warmup + steps):
        fl.cluster.barrier()
        t0 = time.perf_counter()
        strategy.run(step, args=(batch,))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, [v.numpy() for v in variables]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args(argv)
    steps, warmup = (5, 1) if args.quick else (30, 3)
    import flowlab as fl

    print(f"data-parallel scaling: MLP 64-{args.hidden}-1, global batch {args.batch}, {steps} timed steps")
    print(f"machine : {Cm.cpu_model()}; {Cm.usable_cores()} usable cores")
    rows, base, ok = [], None, True
    for n in args.workers:
        with fl.cluster.LocalCluster(workers=n, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}) as c:
            out = c.run(train, args.batch, args.hidden, steps, warmup, timeout=600)
        same = all(np.allclose(a, b) for r in out for a, b in zip(r[1], out[0][1]))
        ok &= same
        t = statistics.median(max(ts) for ts in zip(*(r[0] for r in out)))
        thr = args.batch / t
        base = base or (thr if n == 1 else None)
        eff = "n/a" if base is None else f"{thr / (n * base):.2f}"
        rows.append([str(n), Cm.fmt_us(t), f"{thr:,.0f}", eff, "yes" if same else "NO"])
    print("\n".join(Cm.table(["workers", "step (us)", "examples/s", "efficiency", "same weights"], rows)))
    if not ok:
        print("CHECK FAILED: workers ended with different weights")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
