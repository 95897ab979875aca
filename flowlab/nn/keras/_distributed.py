"""``fit``/``evaluate`` under a distribution strategy (the one whose scope ``compile`` ran in).

Each step is eager around ``strategy.run`` (a custom loop can trace ``strategy.run`` whole, see
flowlab/distribute/_traced.py; fit does not yet): the global batch is split over
the replicas (``strategy.experimental_distribute_dataset``), and each replica runs the forward
pass, the loss and the gradients as one traced ``@fl.function`` (``run_eagerly=False``), then
``optimizer.apply_gradients`` eagerly, where the strategy's replica hook sums the gradients over
every replica and applies them once. Each replica's gradient is that of its mean loss times
(its batch size / the global batch size), so the sum is exactly the gradient of the global batch's
mean loss, as on one replica. The metrics are shared by the replica threads: their updates take a
lock. At the end of an epoch every worker reduces each log with ``strategy.reduce`` (a collective).
"""
from __future__ import annotations

import threading

import numpy as np

from ...core import dtypes
from ...core.function import TensorSpec, function
from ...core.tape import GradientTape
from ...core.tensor import convert_to_tensor

__all__ = ["strategy_of", "runner", "reduce_logs", "shared_seed", "is_chief", "current_strategy",
           "set_strategy_hook"]

_strategy_hook = None


def set_strategy_hook(fn):
    """``fn()``: the strategy whose scope the caller is in, or None. flowlab.distribute sets it (nn
    does not import distribute, a layer above it)."""
    global _strategy_hook
    _strategy_hook = fn


def current_strategy():
    """The strategy whose scope this code runs in (what ``compile`` records), or None."""
    return _strategy_hook() if _strategy_hook is not None else None


def strategy_of(model):
    """The strategy ``model`` was compiled under, when it has more than one replica; else None."""
    s = getattr(model, "_distribute_strategy", None)
    if s is None or s.num_replicas_in_sync <= 1:
        return None
    return s


def is_chief(strategy) -> bool:
    return strategy is None or bool(strategy.extended.should_checkpoint)


def shared_seed(strategy, seed):
    """Worker 0's shuffle seed on every worker (a collective when there are several workers)."""
    if seed is None or strategy is None or strategy.num_workers <= 1:
        return seed
    from ...cluster.collectives import broadcast
    out = broadcast(np.array([int(seed)], np.int64), root=0, comm=strategy._comm, algorithm=strategy._algorithm,
                    timeout=strategy._timeout)
    return int(np.asarray(out).reshape(-1)[0])


def reduce_logs(strategy, logs: dict) -> dict:
    """Each log averaged over the workers, in the same order on every worker."""
    return {k: float(strategy.reduce("mean", convert_to_tensor(np.float32(v)), axis=None).numpy())
            for k, v in logs.items()}


def _check_default_step(model, kind):
    from .model import Model
    name = {"train": "train_step", "test": "test_step"}[kind]
    if getattr(type(model), name) is not getattr(Model, name):
        raise NotImplementedError(f"fit/evaluate under a distribution strategy run the default {name}; a model "
                                  f"that overrides {name} must be trained with a custom loop and strategy.run")


def runner(model, strategy, kind, specs):
    """``run(*global_batch_arrays)``: one distributed ``kind`` step ("train" or "test")."""
    _check_default_step(model, kind)
    lock = threading.Lock()
    eager = model.run_eagerly
    n_parts = len(specs)
    variables = model.trainable_variables

    def forward_train(*args):
        x, y = args[0], args[1]
        sw = args[2] if n_parts > 2 else None
        scale = args[n_parts]
        with GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.loss(y, y_pred, sw)
            scaled = loss * scale
        grads = tape.gradient(scaled, variables)
        return loss, y_pred, list(grads)

    def forward_test(*args):
        x, y = args[0], args[1]
        sw = args[2] if n_parts > 2 else None
        y_pred = model(x, training=False)
        return model.loss(y, y_pred, sw), y_pred

    fn = forward_train if kind == "train" else forward_test
    if not eager:
        signature = [TensorSpec(shape, dtypes.as_dtype(dtype)) for shape, dtype in specs]
        if kind == "train":
            signature.append(TensorSpec([], dtypes.float32))
        fn = function(fn, input_signature=signature, name=f"{model.name}_{kind}_replica_step").get_concrete_function()

    def update_metrics(parts, loss, y_pred, size):
        y = parts[1]
        sw = parts[2] if n_parts > 2 else None
        with lock:
            model._loss_tracker.update_state(loss, sample_weight=float(size))
            for m in model._compiled_metrics:
                m.update_state(y, y_pred, sw)

    def replica_step(parts, global_size):
        parts = tuple(parts)
        size = int(parts[0].shape[0])
        if kind == "train":
            if size:
                loss, y_pred, grads = fn(*parts, convert_to_tensor(np.float32(size / global_size)))
            else:       # nothing to compute here, but the all-reduce needs this replica
                loss = y_pred = None
                grads = [convert_to_tensor(np.zeros_like(v.numpy())) for v in variables]
            model.optimizer.apply_gradients(zip(grads, variables))
        elif size:
            loss, y_pred = fn(*parts)
        if size:
            update_metrics(parts, loss, y_pred, size)
        return None

    def run(*batch):
        global_size = int(np.shape(batch[0])[0])
        dist = strategy.experimental_distribute_dataset([tuple(batch)])
        for per_replica in dist:
            strategy.run(replica_step, args=(per_replica, global_size))
        return None

    return run
