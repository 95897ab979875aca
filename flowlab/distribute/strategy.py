"""The :class:`Strategy` base: replicas, ``scope``, ``run``, ``reduce`` and the gradient sync.

A strategy has ``L`` local replicas in this process (devices, run on one thread each) and
``W`` processes (workers) joined by a communicator; ``num_replicas_in_sync = L * W``.

``run(fn, args)`` calls ``fn`` once per local replica, in replica context (``get_replica_context()``
says which replica it is), under ``fl.device(replica's device)``, each with its own component of
:class:`PerReplica` arguments. Inside, ``optimizer.apply_gradients`` is synchronous: every
replica's gradients are summed with an all-reduce (a ring over the local replicas' threads, then
over the workers' communicator), and the update is applied once per process; all replicas then go
on with the same variables. Variables are therefore shared by the local replicas (a mirror with
one copy in host memory) and kept equal across workers: a variable created in ``scope()`` takes
worker 0's initial value as it is created (a broadcast), so the workers start from the same weights.

Inside ``@fl.function``, ``run`` and ``reduce`` trace instead of running: each replica's ops join
the graph on its device, and the gradient all-reduce becomes graph nodes (see :mod:`._traced`), so
the whole custom step (``strategy.run`` of a function that computes gradients and calls
``apply_gradients``, then ``strategy.reduce``) runs as one graph per step. PerReplica values (the
distributed dataset's batches) are ordinary arguments of the traced function.

The sum (not mean) is deliberate, as in TensorFlow: scale each replica's loss by the *global*
batch size (:func:`compute_average_loss`), and N replicas compute exactly the gradient one replica
would on the whole batch.
"""
from __future__ import annotations

import contextlib
import queue
import threading

import numpy as np

from ..core.backends import to_numpy
from ..core.tensor import variable_creator_scope
from ..nn.keras.distribution import set_scope_hook
from ..nn.optimizers import set_replica_hook
from ..nn.replica_losses import compute_average_loss, set_replica_hook as set_loss_replica_hook  # noqa: F401
from ._traced import TraceStep, reduce_traced, run_traced
from .reduce_op import ReduceOp
from .values import PerReplica, map_structure

__all__ = ["Strategy", "ReplicaContext", "get_strategy", "has_strategy", "get_replica_context",
           "in_cross_replica_context", "compute_average_loss"]

_tls = threading.local()


class ReplicaContext:
    """Where ``fn`` runs inside ``strategy.run``: ``replica_id_in_sync_group`` and
    ``num_replicas_in_sync``; ``all_reduce(op, value)`` combines a value over every replica."""

    def __init__(self, strategy, local_id: int, step):
        self.strategy, self.local_id, self._step = strategy, local_id, step
        self.replica_id_in_sync_group = strategy._worker * strategy._num_local + local_id
        self.num_replicas_in_sync = strategy.num_replicas_in_sync
        self.device = strategy._devices[local_id]

    def all_reduce(self, reduce_op, value):
        """``value`` (a tensor or a structure of them) summed or averaged over every replica."""
        op = ReduceOp.of(reduce_op)
        if isinstance(self._step, TraceStep):
            self._step.all_reduce_sum(self.local_id, [])    # raises: not while the replicas are traced
        from ..core.tensor import convert_to_tensor
        leaves = []
        map_structure(lambda v: leaves.append(to_numpy(convert_to_tensor(v)._value)), value)
        summed = self._step.all_reduce_sum(self.local_id, leaves)
        n = self.num_replicas_in_sync
        it = iter(summed)
        return map_structure(lambda _: convert_to_tensor(next(it) / n if op is ReduceOp.MEAN else next(it)), value)

    def __repr__(self):
        return f"<ReplicaContext replica {self.replica_id_in_sync_group} of {self.num_replicas_in_sync}>"


class _Step:
    """What the local replicas of one ``run`` share: a LocalGroup for all-reduces among their
    threads, a barrier, and a slot for results handed from replica 0 to the others."""

    def __init__(self, strategy):
        self.strategy = strategy
        n = strategy._num_local
        self.group = None
        if n > 1:
            from ..cluster.collectives import LocalGroup
            self.group = LocalGroup(n, segment_bytes=None)
            self.barrier = threading.Barrier(n, timeout=strategy._timeout)
        self.shared = None

    def sync(self):
        if self.group is not None:
            self.barrier.wait()

    def all_reduce_sum(self, local_id: int, arrays: list) -> list:
        """The sum of ``arrays`` over every replica (every local replica calls it)."""
        if not arrays:
            return []
        s = self.strategy
        dtype = np.result_type(*arrays)
        flat = np.concatenate([a.astype(dtype, copy=False).ravel() for a in arrays]) if len(arrays) > 1 \
            else arrays[0].astype(dtype, copy=False).ravel()
        from ..cluster.collectives import allreduce
        if self.group is not None:
            flat = allreduce(flat, algorithm=s._algorithm, comm=self.group[local_id], timeout=s._timeout)
        if s._comm is not None and s._comm.size > 1:
            if local_id == 0:
                self.shared = allreduce(flat, comm=s._comm, algorithm=s._algorithm, timeout=s._timeout)
            self.sync()
            flat = self.shared
            self.sync()
        out, at = [], 0
        for a in arrays:
            out.append(flat[at:at + a.size].reshape(a.shape).astype(a.dtype, copy=False))
            at += a.size
        return out

    def close(self):
        if self.group is not None:
            self.barrier.abort()
            self.group.close()


class Strategy:
    """Base of the strategies (see the module docstring). Subclasses set the devices and the
    communicator."""

    _central = False      # CentralStorageStrategy: variables on the CPU, one copy
    _no_traced_run = None  # why strategy.run cannot be traced with this strategy (None: it can)
    _cluster_resolver = None

    def __init__(self, devices, comm=None, algorithm: str = "ring", timeout: float | None = None):
        if not devices:
            raise ValueError("a strategy needs at least one device")
        self._devices = list(devices)
        self._num_local = len(self._devices)
        self._comm = comm
        self._num_workers = comm.size if comm is not None else 1
        self._worker = comm.rank if comm is not None else 0
        self._algorithm = algorithm
        self._timeout = timeout if timeout is not None else 120.0
        self.extended = self

    # -- what it is -----------------------------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_local * self._num_workers

    @property
    def worker_devices(self) -> tuple:
        return tuple(self._devices)

    @property
    def num_workers(self) -> int:
        """Processes in this strategy (1 for the strategies of one process)."""
        return self._num_workers

    @property
    def worker_index(self) -> int:
        """This process's place among them (0: the chief, which should write checkpoints and logs)."""
        return self._worker

    @property
    def should_checkpoint(self) -> bool:
        return self._worker == 0

    @property
    def cluster_resolver(self):
        """The cluster resolver this strategy was made from (``task_type``, ``task_id``,
        ``cluster_spec()``; see :mod:`.cluster_resolver`); None for MirroredStrategy and CentralStorageStrategy."""
        return self._cluster_resolver

    def __repr__(self):
        return (f"<{type(self).__name__}: {self.num_replicas_in_sync} replica(s), devices {self._devices}"
                f"{f', worker {self._worker} of {self._num_workers}' if self._num_workers > 1 else ''}>")

    # -- scope ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self):
        """Inside, ``get_strategy()`` is this strategy; variables made here are the mirrored ones
        (placed on the CPU for CentralStorageStrategy, on the first replica's device otherwise)."""
        from ..core.device import device
        stack = _tls.__dict__.setdefault("strategies", [])
        stack.append(self)
        mirror = self._comm is not None and self._comm.size > 1
        try:
            with contextlib.ExitStack() as scopes:
                if mirror:   # every worker's new variables take worker 0's values
                    scopes.enter_context(variable_creator_scope(self._on_variable_created))
                scopes.enter_context(device("/cpu:0" if self._central else self._devices[0]))
                yield self
        finally:
            stack.pop()

    def _on_variable_created(self, v):
        """Every worker creates the same variables in the same order: each takes worker 0's value."""
        from ..cluster.collectives import broadcast
        old = np.array(v._value, order="C")
        new = broadcast(old, root=0, comm=self._comm, algorithm=self._algorithm, timeout=self._timeout)
        v._value = np.array(new, dtype=old.dtype).reshape(old.shape)

    # -- running --------------------------------------------------------------------------------
    def run(self, fn, args=(), kwargs=None):
        """``fn(*args, **kwargs)`` once per local replica; a PerReplica of the results (the plain
        result with one local replica). PerReplica arguments give each replica its component."""
        from ..core.interpreters import current_graph
        if current_graph() is not None:     # inside @fl.function: the replicas become parts of the graph
            return run_traced(self, fn, args, kwargs or {})
        kwargs = kwargs or {}
        n = self._num_local
        if n == 1:
            return self._call(fn, 0, _Step(self), args, kwargs)
        step, pool = self._replicas()
        for i in range(n):
            pool.put(i, (self._call, fn, i, step, args, kwargs))
        results, errors = [None] * n, [None] * n
        for _ in range(n):
            i, result, error = pool.done.get()
            if error is not None:
                errors[i] = error
                step.close()            # the other replicas stop waiting for this one
            else:
                results[i] = result
        failed = [(i, e) for i, e in enumerate(errors) if e is not None]
        if failed:
            self._pool_state = None      # a fresh group and barrier for the next step
            # the replica that failed first is the one whose error is not a consequence of another's
            from ..cluster.collectives import CollectiveError
            cause = [(i, e) for i, e in failed if not isinstance(e, (threading.BrokenBarrierError, CollectiveError))]
            i, e = (cause or failed)[0]
            e.add_note(f"(in replica {i} of {n}, on {self._devices[i]})") if hasattr(e, "add_note") else None
            raise e
        return PerReplica(results)

    def _replicas(self):
        """The threads of the local replicas and what they share, made once (again after a failure)."""
        st = getattr(self, "_pool_state", None)
        if st is None:
            pool = getattr(self, "_pool", None)
            if pool is None:
                pool = self._pool = _Pool(self._num_local)
                import weakref
                weakref.finalize(self, pool.stop)
            st = self._pool_state = (_Step(self), pool)
        return st

    def _call(self, fn, i, step, args, kwargs):
        from ..cluster.collectives import use
        from ..core.device import device
        ctx = ReplicaContext(self, i, step)
        prev = getattr(_tls, "replica", None)
        _tls.replica = ctx
        stack = _tls.__dict__.setdefault("strategies", [])
        stack.append(self)
        try:
            a = tuple(_component(x, i) for x in args)
            kw = {k: _component(v, i) for k, v in kwargs.items()}
            with contextlib.ExitStack() as es:
                if step.group is not None:
                    es.enter_context(use(step.group[i]))
                es.enter_context(device(self._devices[i]))
                return fn(*a, **kw)
        finally:
            stack.pop()
            _tls.replica = prev

    # -- reducing -------------------------------------------------------------------------------
    def reduce(self, reduce_op, value, axis=None):
        """Combine a PerReplica value (or one value per process) over every replica. With ``axis``
        the values are also reduced along that axis (MEAN then averages over all the examples)."""
        op = ReduceOp.of(reduce_op)
        from ..core.interpreters import current_graph
        if current_graph() is not None:
            return reduce_traced(self, op, value, axis)
        from ..core.tensor import convert_to_tensor
        parts = [to_numpy(convert_to_tensor(v)._value) for v in self.experimental_local_results(value)]
        if axis is None:
            total = parts[0].astype(np.result_type(parts[0], np.float32) if op is ReduceOp.MEAN else parts[0].dtype)
            for p in parts[1:]:
                total = total + p
            count = np.asarray(float(len(parts)))
        else:
            total = sum(p.sum(axis=axis) for p in parts)
            count = np.asarray(float(sum(p.shape[axis] for p in parts)))
        if self._comm is not None and self._comm.size > 1:
            from ..cluster.collectives import allreduce
            both = allreduce(np.concatenate([np.ravel(total).astype(np.float64), [float(count)]]),
                             comm=self._comm, algorithm=self._algorithm, timeout=self._timeout)
            total = both[:-1].reshape(np.shape(total)).astype(np.asarray(total).dtype)
            count = both[-1]
        if op is ReduceOp.MEAN:
            total = total / count
            if np.asarray(parts[0]).dtype.kind == "f":
                total = np.asarray(total).astype(parts[0].dtype)
        return convert_to_tensor(np.asarray(total))

    def experimental_local_results(self, value) -> tuple:
        """The components of ``value`` on this process's replicas, as a tuple."""
        return value.values if isinstance(value, PerReplica) else (value,)

    # -- input ----------------------------------------------------------------------------------
    def experimental_distribute_dataset(self, dataset, options=None):
        """Global batches of ``dataset``, each split over the replicas (see :mod:`.input`)."""
        from .input import DistributedDataset
        return DistributedDataset(dataset, self)

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        """Per-replica batches from ``dataset_fn(InputContext)``, called once per process."""
        from .input import DistributedDatasetFromFunction
        return DistributedDatasetFromFunction(dataset_fn, self)

    # -- what Model.fit asks of a strategy (flowlab.nn.keras.distribution.FitStrategy) ----------
    def fit_step(self, model, kind: str, specs):
        """fit's (``kind="train"``) or evaluate's (``"test"``) step over the replicas, for batches of
        arrays shaped ``specs``: see :mod:`.keras_fit`. None with one replica: the model's own step."""
        if self.num_replicas_in_sync <= 1:
            return None
        from .keras_fit import step_for
        return step_for(self, model, kind, specs)

    def chief_int(self, value: int) -> int:
        """Worker 0's ``value`` on every worker (a broadcast when there are several)."""
        if self._num_workers <= 1:
            return int(value)
        from ..cluster.collectives import broadcast
        out = broadcast(np.array([int(value)], np.int64), root=0, comm=self._comm, algorithm=self._algorithm,
                        timeout=self._timeout)
        return int(np.asarray(out).reshape(-1)[0])

    def gather_rows(self, row) -> np.ndarray:
        """Every worker's float64 ``row`` (all the same length), one row per worker in worker order:
        shape ``(num_workers, len(row))``. A collective: every worker calls it at the same point."""
        row = np.ascontiguousarray(row, np.float64).reshape(1, -1)
        if self._num_workers <= 1:
            return row
        from ..cluster.collectives import allgather
        out = allgather(row, comm=self._comm, algorithm=self._algorithm, timeout=self._timeout)
        return np.asarray(out).reshape(self._num_workers, row.shape[1])

    def reduce_logs(self, logs: dict) -> dict:
        """Each log averaged over the workers with :meth:`reduce`, in the same order on every worker."""
        from ..core.tensor import convert_to_tensor
        return {k: float(self.reduce("mean", convert_to_tensor(np.float32(v)), axis=None).numpy())
                for k, v in logs.items()}

    # -- the synchronous update (called by optimizer.apply_gradients in replica context) --------
    def _apply_in_replica(self, ctx, optimizer, apply, grads_and_vars):
        pairs = list(grads_and_vars)
        live = [(g, v) for g, v in pairs if g is not None]
        from ..core.tensor import convert_to_tensor
        grads = [to_numpy(convert_to_tensor(g)._value) for g, _ in live]
        step = ctx._step
        summed = step.all_reduce_sum(ctx.local_id, grads)
        result = None
        if ctx.local_id == 0:
            result = apply(optimizer, [(g, v) for g, (_, v) in zip(summed, live)])
        step.sync()       # the others continue only once the variables are updated
        return result if result is not None else optimizer.iterations


class _Pool:
    """One long-lived thread per local replica: ``put(i, (fn, *args))`` runs ``fn(*args)`` on
    thread ``i``; ``done`` receives ``(i, result, error)``."""

    def __init__(self, n: int):
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes = [queue.SimpleQueue() for _ in range(n)]
        for i, inbox in enumerate(self._inboxes):
            threading.Thread(target=_serve, args=(i, inbox, self.done), name=f"flowlab-replica-{i}",
                             daemon=True).start()

    def put(self, i, job):
        self._inboxes[i].put(job)

    def stop(self):
        for inbox in self._inboxes:
            inbox.put(None)


def _serve(i, inbox, done):
    while True:
        job = inbox.get()
        if job is None:
            return
        try:
            done.put((i, job[0](*job[1:]), None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller of run
            done.put((i, None, e))
        job = None


def _component(x, i):
    return x.values[i] if isinstance(x, PerReplica) else x


# -- contexts ---------------------------------------------------------------------------------------
class _DefaultStrategy(Strategy):
    """The strategy in use outside any scope: one replica, this process, no communication."""

    def __init__(self):
        super().__init__(["/cpu:0"])


_default = None


def get_strategy() -> Strategy:
    """The strategy whose scope (or run) this code is in; a one-replica default otherwise."""
    stack = getattr(_tls, "strategies", None)
    if stack:
        return stack[-1]
    global _default
    if _default is None:
        _default = _DefaultStrategy()
    return _default


def has_strategy() -> bool:
    return bool(getattr(_tls, "strategies", None))


def get_replica_context():
    """The ReplicaContext inside ``strategy.run``; None in cross-replica context (a scope)."""
    ctx = getattr(_tls, "replica", None)
    if ctx is None and not has_strategy():
        return ReplicaContext(get_strategy(), 0, _Step(get_strategy()))
    return ctx


def in_cross_replica_context() -> bool:
    return has_strategy() and getattr(_tls, "replica", None) is None


def _replica_count():
    """``fl.nn.compute_average_loss`` (one copy, in nn/replica_losses.py) asks through this hook: the
    number of replicas in sync here, and whether this is cross-replica context."""
    ctx = getattr(_tls, "replica", None)
    if ctx is not None:
        return ctx.num_replicas_in_sync, False
    return get_strategy().num_replicas_in_sync, in_cross_replica_context()


set_loss_replica_hook(_replica_count)


# -- the optimizer hook -------------------------------------------------------------------------------
def _replica_apply(optimizer, grads_and_vars, apply):
    """``Optimizer.apply_gradients`` goes through here (``nn.optimizers.set_replica_hook``): inside a
    replica of ``strategy.run`` the strategy all-reduces the gradients and applies them once; outside
    one, ``apply`` runs as usual."""
    ctx = getattr(_tls, "replica", None)
    if ctx is None or getattr(_tls, "applying", False):
        return apply(optimizer, grads_and_vars)
    from ..core.interpreters import current_graph
    traced = isinstance(ctx._step, TraceStep)
    if current_graph() is not None and not traced:
        if ctx.strategy._no_traced_run:
            raise NotImplementedError(
                f"{optimizer.name}.apply_gradients inside @fl.function: {ctx.strategy._no_traced_run}")
        raise NotImplementedError(
            f"{optimizer.name}.apply_gradients inside an @fl.function called from an eager strategy.run: the "
            f"gradient all-reduce would run while tracing. Put @fl.function around the whole step instead "
            f"(it may call strategy.run and strategy.reduce), or return the gradients from the traced "
            f"function and call apply_gradients outside it, in the replica function")
    _tls.applying = True
    try:
        if traced:
            return ctx._step.apply(ctx, optimizer, apply, grads_and_vars)
        return ctx.strategy._apply_in_replica(ctx, optimizer, apply, grads_and_vars)
    finally:
        _tls.applying = False


set_replica_hook(_replica_apply)


# -- Model.compile records the strategy whose scope it runs in (nn does not import distribute) --------
def _scope_strategy():
    return get_strategy() if has_strategy() else None


set_scope_hook(_scope_strategy)
