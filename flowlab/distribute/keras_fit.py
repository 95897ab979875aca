"""The steps of ``Model.fit``/``evaluate`` under a distribution strategy (the one whose scope ``compile``
ran in): what ``Strategy.fit_step`` gives Keras (see flowlab/nn/keras/distribution.py, the protocol).

The global batch is split over the replicas as ``strategy.experimental_distribute_dataset`` splits
it (with several workers, each keeps its own replicas' pieces). Each replica's gradient is that of
its mean loss times (its piece's size / the global batch size), so the sum over the replicas is
exactly the gradient of the global batch's mean loss, as on one replica. A replica whose piece is
empty (a global batch smaller than the number of replicas, or a short last batch) computes
nothing and adds zero gradients, since the all-reduce needs every replica. The loss tracker is
updated with each piece's mean loss weighted by the piece's size, and each compiled metric with
each piece, so the logs are those of one replica. At the end of an epoch every worker averages
each log over the workers with ``strategy.reduce`` (a collective).

Traced (``run_eagerly=False``, the default; :class:`TracedStep`): the whole step is one
``@fl.function`` over the replicas' pieces that calls ``strategy.run(replica_step)``, which the
strategy traces (flowlab/distribute/_traced.py): every replica's forward pass, loss, gradient and
metric updates become parts of one graph, each on its replica's device, and its
``optimizer.apply_gradients`` adds the gradient sum (the all-reduce node across workers for
MultiWorkerMirroredStrategy) and the one update. There are no replica threads, and a step is one
call of the compiled plan. A trace is made for each distinct global batch shape, on its first
batch, and kept with the model until it is recompiled: a typical epoch makes one trace, or two
when the last batch is smaller, and later epochs (and later ``fit`` calls) reuse them. Which rows
of a global batch each local replica takes is learnt once per batch size, by distributing the row
numbers through the strategy; each step then just slices the arrays.

Scheduled (ParameterServerStrategy's ``fit_step``; :class:`ScheduledStep`):
each train step runs on a worker, which pulls the variables from the ps tasks and pushes its
gradients back (asynchronous training); the logs come from the steps' returned losses and
predictions, and the weights are pulled here at the end of each epoch.

Eager (``run_eagerly=True``, or a strategy that cannot trace ``strategy.run``: ``_no_traced_run``
set; :class:`EagerStep`): each step runs ``strategy.run`` on the replicas' threads; each replica
computes its loss and gradients (as one traced ``@fl.function`` of its own, unless
``run_eagerly=True``), then calls ``optimizer.apply_gradients`` eagerly, where the strategy's
replica hook sums the gradients over every replica and applies them once. The metrics are shared
by the replica threads: their updates take a lock.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from ..core import dtypes
from ..core.function import TensorSpec, function
from ..core.tape import GradientTape
from ..core.tensor import convert_to_tensor
from ..nn.keras.distribution import FitStep, check_default_step, update_metrics

__all__ = ["step_for", "TracedStep", "EagerStep", "ScheduledStep"]

_MANY_SHAPES = 5     # a traced step warns when it is called with more global batch shapes than this


def step_for(strategy, model, kind, specs) -> FitStep:
    """One distributed ``kind`` step ("train" or "test") for batches shaped ``specs``: the traced
    :class:`TracedStep`, or, with ``run_eagerly=True`` or a strategy that cannot trace
    ``strategy.run`` (``_no_traced_run``), the :class:`EagerStep`."""
    check_default_step(model, kind)
    if model.run_eagerly or strategy._no_traced_run:
        return EagerStep(model, strategy, kind, specs)
    return TracedStep(model, strategy, kind, len(specs))


class ScheduledStep(FitStep):
    """fit's train step under a strategy that schedules steps on its workers (parameter servers):
    each batch becomes one step scheduled on the least busy worker (:func:`_scheduled_train_step`:
    pull the variables, forward, loss, gradients, push them to the ps tasks), without waiting for
    it. At most one step per worker is in flight: before scheduling more, the oldest one's result
    (its loss and predictions) is collected and goes into the metrics here, so the logs of a batch
    lag by at most that many steps. :meth:`finish`, at the end of each epoch, collects the rest
    and pulls the variables, so this process's model has the ps tasks' weights (for evaluate,
    predict, checkpoints and callbacks)."""

    def __init__(self, model, strategy, n_parts):
        self.model, self.n_parts = model, n_parts
        self.coordinator = strategy.fit_coordinator()
        self.limit = max(1, len(strategy.worker_tasks))
        self.inflight = []

    def __call__(self, *batch):
        while len(self.inflight) >= self.limit:
            self._collect()
        value = self.coordinator.schedule(_scheduled_train_step, args=(self.model, *batch))
        self.inflight.append((value, batch))
        return None

    def _collect(self):
        value, batch = self.inflight.pop(0)
        loss, y_pred = value.fetch()
        sw = convert_to_tensor(batch[2]) if self.n_parts > 2 else None
        update_metrics(self.model, convert_to_tensor(batch[1]), sw, convert_to_tensor(loss),
                       convert_to_tensor(y_pred), int(np.shape(batch[0])[0]))

    def finish(self):
        while self.inflight:
            self._collect()
        self.coordinator.join()


def _scheduled_train_step(model, x, y, sw=None):
    """One train step on a worker of a parameter-server fit (the model is this worker's copy, its
    variables those of the ps tasks, just pulled): ``apply_gradients`` pushes the gradients."""
    with GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.loss(y, y_pred, sw)
    variables = model.trainable_variables
    model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss.numpy(), y_pred.numpy()


class TracedStep(FitStep):
    """One ``@fl.function`` per step: ``strategy.run`` of the replica step (forward, loss scaled by
    the piece's share of the global batch, ``tape.gradient``, the metrics' updates and
    ``apply_gradients``), traced whole. Called with a global batch's arrays: the rows each local
    replica takes (the strategy's own split, learnt once per batch size by distributing the row
    numbers) are sliced out and fed to the trace for that size (traced on its first batch)."""

    def __init__(self, model, strategy, kind, n_parts):
        self.model, self.strategy, self.kind, self.n_parts = model, strategy, kind, n_parts
        self.name = f"{model.name}_distributed_{kind}_step"
        self.function = function(self._step, name=self.name)
        self.function._warned = True    # its advice (tensor arguments, input_signature) does not apply: see _plan
        self._plans: dict = {}      # (shape, dtype) of each global batch array -> (trace, rows per local replica, call)

    @property
    def trace_count(self) -> int:
        """How many traces the step has made (one per distinct global batch shape)."""
        return self.function.experimental_get_tracing_count()

    def __call__(self, *batch):
        arrays = [np.asarray(a) for a in batch]
        key = tuple((a.shape, a.dtype) for a in arrays)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(arrays)
        _, rows, call = plan
        call(*[a[r] for r in rows for a in arrays])
        return None

    def _plan(self, arrays):
        s = self.strategy
        size = int(arrays[0].shape[0])
        # which rows of a global batch of `size` go to each local replica: the strategy's split of 0..size-1
        index = next(iter(s.experimental_distribute_dataset([(np.arange(size),)])))
        rows = []
        for part in s.experimental_local_results(index):
            idx = np.asarray(part[0], dtype=np.int64)
            start = int(idx[0]) if idx.size else 0
            contiguous = np.array_equal(idx, np.arange(start, start + idx.size))
            rows.append(slice(start, start + idx.size) if contiguous else idx)     # a view where it can be
        pieces = next(iter(s.experimental_distribute_dataset([tuple(arrays)])))
        if len(self._plans) == _MANY_SHAPES:
            warnings.warn(f"{self.name}: {self.kind} batches of {_MANY_SHAPES + 1} different shapes so far under "
                          f"{type(s).__name__}, and each shape is traced anew (the replicas' pieces are "
                          f"shaped statically): give batches of one size (e.g. batch(..., drop_remainder=True)), "
                          f"or compile with run_eagerly=True", stacklevel=5)
        concrete = self.function.get_concrete_function(pieces, size)
        # the pieces have the shapes and dtypes the trace was made for (the key): no per-call checks
        fits = [p._dtype for p in concrete.inputs] == [a.dtype for _ in rows for a in arrays]
        return concrete, rows, (concrete.unchecked_call if fits else concrete)

    def _step(self, pieces, global_size):
        self.strategy.run(self._replica_step, args=(pieces, global_size))
        return None

    def _replica_step(self, parts, global_size):
        model = self.model
        parts = tuple(parts)
        x, y = parts[0], parts[1]
        sw = parts[2] if self.n_parts > 2 else None
        size = int(x.shape[0])
        if self.kind == "train":
            variables = model.trainable_variables
            if size:
                with GradientTape() as tape:
                    y_pred = model(x, training=True)
                    loss = model.loss(y, y_pred, sw)
                    scaled = loss * convert_to_tensor(np.float32(size / global_size))
                grads = list(tape.gradient(scaled, variables))
                update_metrics(model, y, sw, loss, y_pred, size)
            else:       # nothing to compute here, but the gradient all-reduce needs this replica
                grads = [convert_to_tensor(np.zeros(tuple(v.shape), v.dtype.as_numpy_dtype)) for v in variables]
            model.optimizer.apply_gradients(zip(grads, variables))
        elif size:
            y_pred = model(x, training=False)
            update_metrics(model, y, sw, model.loss(y, y_pred, sw), y_pred, size)
        return None


class EagerStep(FitStep):
    """The eager step: ``strategy.run`` on the replica threads, each replica's forward pass, loss and
    gradients traced per replica (or eager with ``run_eagerly=True``), ``apply_gradients`` eager."""

    def __init__(self, model, strategy, kind, specs):
        self.model, self.strategy, self.kind, self.n_parts = model, strategy, kind, len(specs)
        self.lock = threading.Lock()        # the replica threads share the metrics
        self.variables = None               # the model's trainable variables, once it is built (first call)
        fn = self._forward_train if kind == "train" else self._forward_test
        if not model.run_eagerly:
            signature = [TensorSpec(shape, dtypes.as_dtype(dtype)) for shape, dtype in specs]
            if kind == "train":
                signature.append(TensorSpec([], dtypes.float32))
            fn = function(fn, input_signature=signature, name=f"{model.name}_{kind}_replica_step").get_concrete_function
        self.fn = fn        # traced at the first call, once the model is built

    def _forward_train(self, *args):
        model, n_parts = self.model, self.n_parts
        x, y = args[0], args[1]
        sw = args[2] if n_parts > 2 else None
        with GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.loss(y, y_pred, sw)
            scaled = loss * args[n_parts]
        grads = tape.gradient(scaled, self.variables)
        return loss, y_pred, list(grads)

    def _forward_test(self, *args):
        model = self.model
        x, y = args[0], args[1]
        sw = args[2] if self.n_parts > 2 else None
        y_pred = model(x, training=False)
        return model.loss(y, y_pred, sw), y_pred

    def _replica_step(self, parts, global_size):
        parts = tuple(parts)
        size = int(parts[0].shape[0])
        if self.kind == "train":
            if size:
                loss, y_pred, grads = self.fn(*parts, convert_to_tensor(np.float32(size / global_size)))
            else:       # nothing to compute here, but the all-reduce needs this replica
                loss = y_pred = None
                grads = [convert_to_tensor(np.zeros_like(v.numpy())) for v in self.variables]
            self.model.optimizer.apply_gradients(zip(grads, self.variables))
        elif size:
            loss, y_pred = self.fn(*parts)
        if size:
            with self.lock:
                update_metrics(self.model, parts[1], parts[2] if self.n_parts > 2 else None, loss, y_pred, size)
        return None

    def __call__(self, *batch):
        if self.variables is None:
            self.variables = self.model.trainable_variables
            if not self.model.run_eagerly:
                self.fn = self.fn()         # the concrete function, traced now
        global_size = int(np.shape(batch[0])[0])
        s = self.strategy
        for per_replica in s.experimental_distribute_dataset([tuple(batch)]):
            s.run(self._replica_step, args=(per_replica, global_size))
        return None
