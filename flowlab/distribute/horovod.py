"""Horovod's API over flowlab's collectives: ``import flowlab.horovod as hvd``.

>>> import flowlab.horovod as hvd
>>> hvd.init()
>>> hvd.rank(), hvd.size()
(0, 1)

``init()`` picks the communicator collectives use in this process: the cluster's when it runs in
a LocalCluster worker (``cluster.run(fn)``) or under ``flowlab run -np N``, MPI's world under
``mpiexec``, a group of one otherwise. All ranks of this module's groups run on one machine, so
``local_rank() == rank()`` except under ``mpiexec`` across hosts (read from MPI's environment).

With Keras (``import flowlab.horovod.keras as hvd`` gives the same names): wrap the optimizer
in :func:`DistributedOptimizer` and pass ``callbacks.BroadcastGlobalVariablesCallback(0)`` (and
``callbacks.MetricAverageCallback()``) to ``fit``. ``fit`` traces its step as usual: the gradient
average is then one ``allreduce`` node of the step's graph, the collective op of core's table
that MultiWorkerMirroredStrategy's traced step uses (flowlab/cluster/collectives/ops.py).

In a custom TF2 loop: wrap the tape, ``tape = hvd.DistributedGradientTape(tape)``, so that
``tape.gradient(...)`` returns averaged gradients, and call ``hvd.broadcast_variables(...)`` after the
first step (inside ``@fl.function`` too, under a Python flag). ``hvd.allreduce``, ``hvd.allgather``
and ``hvd.broadcast`` also work on tensors inside ``@fl.function``. Every collective on tensors is
one of those ops (through ``cross_process_reduce`` of flowlab/distribute/_traced.py): run now
eagerly, a graph node while tracing or building a compat.v1 graph. TF1 graphs: see :mod:`flowlab.horovod.graph`.

Learning rate: each step now averages the gradients of ``size()`` batches, so the effective batch
is ``size()`` times larger. The usual convention (as in Horovod's own examples) is to scale the
learning rate by ``size()``: ``fl.optimizers.SGD(0.01 * hvd.size())``, often with a few epochs of
warm-up, and to divide the number of steps per epoch by ``size()``.
"""
from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["init", "is_initialized", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank",
           "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
           "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "join",
           "allreduce", "allgather", "broadcast", "broadcast_variables", "DistributedOptimizer",
           "DistributedGradientTape", "Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression"]
# the Keras callbacks (below) are public as ``hvd.callbacks.*`` (flowlab/horovod/callbacks.py), as in Horovod

Average, Sum, Adasum, Min, Max, Product = "average", "sum", "adasum", "min", "max", "product"
_REDUCTIONS = {Average: "mean", Sum: "sum", Min: "min", Max: "max", Product: "prod"}
_comm = None
_tls = threading.local()      # init() in a thread of a LocalGroup: that thread's rank
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "FLOWLAB_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "FLOWLAB_LOCAL_SIZE")


def init(comm=None) -> None:
    """Join this process's group (``comm``: a communicator to use instead of the default). On a
    ``LocalGroup`` rank's thread, only that thread joins its rank: the process's group is unchanged."""
    global _comm
    from ..cluster.collectives import current, scoped
    if comm is None and scoped() is not None:
        _tls.comm = scoped()
        return
    _comm = _tls.comm = current() if comm is None else comm


def is_initialized() -> bool:
    """Has ``init()`` been called (and no ``shutdown()`` since)?"""
    return (getattr(_tls, "comm", None) or _comm) is not None


def shutdown() -> None:
    """Forget the group (``init`` may be called again). The communicator itself belongs to the
    cluster, ``flowlab run`` or MPI, and stays open."""
    global _comm
    mine, _tls.comm = getattr(_tls, "comm", None), None
    if mine is None or mine is _comm:       # a rank's thread forgets only its own rank
        _comm = None


def process_group():
    """The communicator hvd.init() made (or this thread's); ValueError before hvd.init()."""
    comm = getattr(_tls, "comm", None) or _comm
    if comm is None:
        raise ValueError("Horovod has not been initialized: call hvd.init() first")
    return comm


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    return process_group().rank


def size() -> int:
    """How many ranks take part."""
    return process_group().size


def _env_int(names, default):
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.isdigit():
            return int(v)
    return default


def local_rank() -> int:
    """This process's rank among the processes on its machine."""
    return _env_int(_LOCAL_RANK_VARS, rank())


def local_size() -> int:
    """How many ranks run on this machine (every rank, except under ``mpiexec`` across hosts)."""
    return _env_int(_LOCAL_SIZE_VARS, size())


def cross_size() -> int:
    """How many machines take part (``size() // local_size()``; 1 on one machine)."""
    return max(1, size() // max(1, local_size()))


def cross_rank() -> int:
    """This machine's index among the machines (0 on one machine)."""
    return rank() // max(1, local_size())


def is_homogeneous() -> bool:
    """Does every machine run the same number of ranks?"""
    return size() % max(1, local_size()) == 0


def mpi_threads_supported() -> bool:
    """Does the MPI library in use allow calls from several threads? False unless this process
    runs under ``mpiexec`` with an MPI that gives MPI_THREAD_MULTIPLE."""
    comm = process_group()
    if type(comm).__name__ != "MPICommunicator":
        return False
    from mpi4py import MPI
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def _have(module) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def mpi_built() -> bool:
    """Can flowlab run its collectives over MPI here (is mpi4py installed)?"""
    return _have("mpi4py")


def mpi_enabled() -> bool:
    """Do this group's collectives run over MPI (under ``mpiexec``)?"""
    return type(process_group()).__name__ == "MPICommunicator"


def gloo_built() -> bool:
    """False: flowlab has no Gloo; its own transport (ZeroMQ and shared memory) plays that part."""
    return False


gloo_enabled = gloo_built


def nccl_built() -> bool:
    """False: flowlab's collectives run on the CPU (no NCCL), whatever devices tensors live on."""
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """False: flowlab's collectives never read GPU memory directly."""
    return False


def rocm_built() -> bool:
    return False


def join(device=-1) -> int:
    """Wait until every rank reaches ``join()`` (a barrier); returns 0 (Horovod returns the last
    rank to join, which flowlab does not track). Unlike Horovod, a rank waiting in ``join()`` does
    not stand in for the collectives that other ranks still run, so uneven data would time out:
    give every rank the same number of steps (``dataset.take(N // hvd.size())``)."""
    comm = process_group()
    if comm.size > 1:
        _collectives().barrier(comm=comm)
    return 0




# -- collectives on tensors: eagerly, or as nodes of a traced (or compat.v1) graph ----------------
def _graph_of(tensor):
    """The graph ops on ``tensor`` must be added to: the one being built (``@fl.function`` tracing,
    ``with g.as_default():``), or a compat.v1 graph tensor's own; None when they run now."""
    from ..core import current_graph
    from ..core.graph import GraphTensor
    graph = current_graph()
    if graph is not None:
        return graph
    return tensor.graph if isinstance(tensor, GraphTensor) else None


def _building(graph):
    """Add ops to ``graph`` (made the default graph if it is not already); None: run them now."""
    import contextlib
    from ..core import current_graph
    return contextlib.nullcontext() if graph is None or current_graph() is graph else graph.as_default()


def _as_tensor(tensor, what):
    from ..core.tensor import convert_to_tensor
    try:
        return convert_to_tensor(tensor)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what}: expected a tensor, got {type(tensor).__name__} ({e})") from None


def _reduction(op, average, what):
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError(f"{what}: give op= or the older average=, not both")
    if op == Adasum:
        raise NotImplementedError(f"{what}: op=hvd.Adasum is not implemented in flowlab; use hvd.Average or hvd.Sum")
    if op not in _REDUCTIONS:
        raise ValueError(f"{what}: op must be hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product, got {op!r}")
    return op


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None):
    """``tensor`` averaged (the default, ``op=hvd.Average``) over every rank, or combined with
    ``op=hvd.Sum``/``Min``/``Max``/``Product``; every rank gets the result. Inside ``@fl.function``
    it is a node of the graph (the all-reduce node strategies use), run with every call.
    ``prescale_factor``/``postscale_factor`` multiply before and after; ``compression=``
    ``hvd.Compression.fp16`` sends floats as float16."""
    op = _reduction(op, average, "hvd.allreduce")
    graph = _graph_of(tensor)
    if graph is None and not _is_tensor(tensor) and prescale_factor == 1.0 and postscale_factor == 1.0 \
            and compression in (None, Compression.none):     # numpy arrays and numbers keep their type
        return _collectives().allreduce(tensor, op=_REDUCTIONS[op], comm=process_group())
    with _building(graph):
        t = _as_tensor(tensor, "hvd.allreduce")
        if prescale_factor != 1.0:
            t = t * prescale_factor
        compression = compression or Compression.none
        packed, ctx = compression.compress(t)
        # the allreduce op (differentiable on a GradientTape; a node while traced)
        out = _cross_process_reduce(_Ranks("hvd.allreduce"), [packed], _REDUCTIONS[op])[0]
        out = compression.decompress(out, ctx)
        if postscale_factor != 1.0:
            out = out * postscale_factor
    return out


def allgather(tensor, name=None, ignore_name_scope=False):
    """Every rank's ``tensor`` concatenated along the first axis, in rank order (inside
    ``@fl.function``: a graph node). Every rank gives the same shape here (Horovod also allows
    first dimensions that differ)."""
    graph = _graph_of(tensor)
    if graph is None and not _is_tensor(tensor):     # numpy arrays and numbers keep their type
        return _collectives().allgather(tensor, comm=process_group())
    with _building(graph):
        t = _as_tensor(tensor, "hvd.allgather")
        from ._traced import cross_process_gather
        return cross_process_gather(_Ranks("hvd.allgather"), t)


def broadcast(tensor, root_rank: int = 0, name=None, ignore_name_scope=False):
    """Rank ``root_rank``'s ``tensor`` on every rank (inside ``@fl.function``: a graph node)."""
    _check_root(root_rank, "hvd.broadcast")
    graph = _graph_of(tensor)
    if graph is None and not _is_tensor(tensor):     # numpy arrays and numbers keep their type
        return _collectives().broadcast(tensor, root=root_rank, comm=process_group())
    with _building(graph):
        t = _as_tensor(tensor, "hvd.broadcast")
        return _cross_process_reduce(_Ranks("hvd.broadcast"), [t], "broadcast", root_rank)[0]


def broadcast_variables(variables, root_rank: int = 0):
    """Give every variable the value it has on ``root_rank`` (in place, on every rank): one
    broadcast per dtype. Eagerly it happens now; inside ``@fl.function`` (or while a compat.v1
    graph is built) it becomes graph nodes that read, broadcast and assign when the graph runs,
    at this point of the step, e.g. after the first batch's update::

        if first_batch:         # a Python bool: the first call traces its own graph
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
    """
    _check_root(root_rank, "hvd.broadcast_variables")
    variables = list(variables)
    from ..core.tensor import Variable
    for v in variables:
        if not isinstance(v, Variable):
            raise TypeError(f"hvd.broadcast_variables: expected variables, got {type(v).__name__} "
                            f"({v!r}); pass model.variables or optimizer.variables()")
    if not variables or process_group().size == 1:
        return None
    from ..core import current_graph
    from ..core.graph import Graph
    graph = current_graph()
    if graph is None and isinstance(getattr(variables[0], "graph", None), Graph):
        graph = variables[0].graph                  # compat.v1 variables: nodes of their graph
    by_dtype: dict = {}
    for v in variables:
        by_dtype.setdefault(v.dtype, []).append(v)
    group = _Ranks("hvd.broadcast_variables")
    with _building(graph):
        for same in by_dtype.values():
            values = [v.read_value() for v in same]
            for v, new in zip(same, _cross_process_reduce(group, values, "broadcast", root_rank)):
                v.assign(new)
    return None


def _check_root(root_rank, what):
    n = size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < n:
        raise ValueError(f"{what}: root_rank must be a rank of this group of {n} (0..{n - 1}), got {root_rank!r}")


def _is_tensor(x) -> bool:
    from ..core.tensor import Tensor
    return isinstance(x, Tensor)


def _cross_process_reduce(group, tensors, op, root=0):
    from ._traced import cross_process_reduce
    return cross_process_reduce(group, tensors, op, root)


def _collectives():
    from ..cluster import collectives
    return collectives


# -- the optimizer -------------------------------------------------------------------------------
class _Ranks:
    """This module's ranks as a group the all-reduce graph node (distribute/_traced.py) reduces
    over: the communicator is looked up each time the node runs (``init`` may be called again).
    ``where`` names the call in a failed collective's error."""

    _algorithm = "ring"
    _timeout = None
    _comm_source = staticmethod(process_group)      # looked up each time the collective runs

    def __init__(self, where):
        self._where = where

    @property
    def _comm(self):
        return process_group()

    def _collective_note(self):
        return f"in {self._where}, on rank {rank()} of {size()}"


_RANKS = _Ranks("the gradient all-reduce of hvd.DistributedOptimizer")
_TAPE_RANKS = _Ranks("the gradient all-reduce of hvd.DistributedGradientTape")


class _NoCompression:
    """Gradients travel as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compression:
    """Floating gradients travel as float16 (half the bytes, about 3 significant digits) and are
    cast back after the all-reduce."""

    @staticmethod
    def compress(tensor):
        import flowlab as fl
        if tensor.dtype.is_floating and tensor.dtype != fl.float16:
            return fl.cast(tensor, fl.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        import flowlab as fl
        return tensor if ctx is None else fl.cast(tensor, ctx)


class Compression:
    """How gradients travel in :func:`DistributedOptimizer`'s all-reduce: ``none`` or ``fp16``."""
    none = _NoCompression
    fp16 = _FP16Compression


def _reduce_gradients(grads, op, compression, group):
    """The gradients averaged (or summed) over every rank, in one all-reduce; None stays None.
    Eagerly the all-reduce runs now; while ``@fl.function`` traces (or a compat.v1 graph is built)
    it is a node of the graph, run with every step (the same ops, so the same bits)."""
    out = list(grads)
    if process_group().size == 1:
        return out
    live = [i for i, g in enumerate(out) if g is not None]
    if not live:
        return out
    graph = _graph_of(out[live[0]])
    with _building(graph):
        from ..core.tensor import convert_to_tensor
        packed = [compression.compress(convert_to_tensor(out[i])) for i in live]
        reduced = _cross_process_reduce(group, [t for t, _ in packed], "mean" if op == Average else "sum")
        for i, r, (_, ctx) in zip(live, reduced, packed):
            out[i] = compression.decompress(r, ctx)
    return out


def _check_options(what, op, compression, gradient_predivide_factor, backward_passes_per_step=1):
    if op not in (Average, Sum):
        raise NotImplementedError(f"{what}: op={op!r}: flowlab.horovod averages (hvd.Average) "
                                  "or sums (hvd.Sum) gradients; Adasum is not implemented")
    if backward_passes_per_step != 1:
        raise NotImplementedError(f"{what}: backward_passes_per_step={backward_passes_per_step}: "
                                  "flowlab reduces the gradients at every step; to accumulate gradients over "
                                  "several batches, use a larger batch instead")
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError(f"{what}: gradient_predivide_factor must be 1.0 in flowlab "
                                  "(the average divides once, after the sum)")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError(f"{what}: compression must be hvd.Compression.none or "
                         f"hvd.Compression.fp16, got {compression!r}")


class _Distributed:
    """Mixed into a copy of the optimizer's class: gradients are averaged (or summed) over the
    ranks with one all-reduce before the wrapped class applies them."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        reduced = self.reduce_gradients([g for g, _ in pairs])
        return super().apply_gradients(list(zip(reduced, [v for _, v in pairs])), *args, **kwargs)

    def reduce_gradients(self, grads):
        """The gradients averaged (or summed) over every rank, in one all-reduce; None stays None.
        Eagerly the all-reduce runs now; while ``@fl.function`` traces (``Model.fit``'s step) it is
        a node of the graph, run with every step (the same ops, so the same bits)."""
        return _reduce_gradients(grads, self._hvd_op, self._hvd_compression, _RANKS)


class DistributedGradientTape:
    """``hvd.DistributedGradientTape(tape)``: a GradientTape whose ``gradient()`` returns the
    gradients averaged over every rank (``op=hvd.Sum``: summed), in one all-reduce: eagerly, or
    as a node of the graph inside ``@fl.function`` (the node DistributedOptimizer and the
    strategies use). Wrap the tape after the ``with`` block that recorded the loss::

        with fl.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))   # a plain optimizer

    Everything else (``watch``, ``stop_recording``...) goes to the wrapped tape. Accepted as in
    Horovod and without effect here: the ``device_*`` arguments, ``sparse_as_dense`` (gradients
    are dense), ``num_groups``/``groups`` (one all-reduce for all gradients)."""

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=Compression.none,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None):
        from ..core.tape import GradientTape
        _check_options("DistributedGradientTape", op, compression, gradient_predivide_factor)
        if isinstance(gradtape, DistributedGradientTape):
            raise ValueError("DistributedGradientTape: this tape is distributed already; wrap the plain tape once")
        if not isinstance(gradtape, GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a fl.GradientTape, got {type(gradtape).__name__}: "
                            "record the loss in `with fl.GradientTape() as tape:`, then "
                            "tape = hvd.DistributedGradientTape(tape)")
        self._tape = gradtape
        self._hvd_op = op
        self._hvd_compression = compression

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients="none"):
        """d(target)/d(sources) on this rank, averaged (or summed) over every rank; shaped like
        ``sources`` (a variable, a list or a dict of them), None where the target does not depend
        on a source (on every rank)."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        if isinstance(grads, dict):
            keys = list(grads)
            return dict(zip(keys, _reduce_gradients([grads[k] for k in keys], self._hvd_op,
                                                     self._hvd_compression, _TAPE_RANKS)))
        if isinstance(grads, (list, tuple)):
            return type(grads)(_reduce_gradients(list(grads), self._hvd_op, self._hvd_compression, _TAPE_RANKS))
        return _reduce_gradients([grads], self._hvd_op, self._hvd_compression, _TAPE_RANKS)[0]

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, name):
        if name == "_tape":
            raise AttributeError(name)
        return getattr(self._tape, name)


_classes: dict = {}


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None):
    """``optimizer`` made distributed: an instance of a subclass of its class (so ``compile`` and
    checkpoints take it as the optimizer it was) that shares its state and whose
    ``apply_gradients`` (hence ``minimize``, and ``Model.fit``'s traced step) first averages every
    gradient over the ranks (``op=hvd.Sum``: sums), in one all-reduce.

    Accepted as in Horovod and without effect here: ``name``, the ``device_*`` arguments,
    ``sparse_as_dense`` (gradients are dense), ``num_groups``/``groups`` (all gradients go in one
    all-reduce anyway), ``average_aggregated_gradients`` (with one backward pass per step)."""
    _check_options("DistributedOptimizer", op, compression, gradient_predivide_factor, backward_passes_per_step)
    if isinstance(optimizer, _Distributed):
        raise ValueError("DistributedOptimizer: this optimizer is distributed already; wrap the plain "
                         "optimizer once")
    cls = type(optimizer)
    dist = _classes.get(cls)
    if dist is None:
        dist = _classes[cls] = type(f"Distributed{cls.__name__}", (_Distributed, cls), {"__module__": __name__})
    out = dist.__new__(dist)
    out.__dict__.update(optimizer.__dict__)
    out._hvd_op = op
    out._hvd_compression = compression
    return out


# -- Keras callbacks (``hvd.callbacks``) ------------------------------------------------------------
from ..nn.keras.callbacks import Callback  # noqa: E402  (nn is a layer below: no cycle)


class BroadcastGlobalVariablesCallback(Callback):
    """At the start of ``fit`` (before the first step), give every rank the model's weights and the
    optimizer's step count from ``root_rank``, so all ranks start from the same state.

    Horovod broadcasts at the end of the first batch instead, because TensorFlow makes a Keras
    model's weights on the first call; ``fit`` builds the model before its callbacks start, so
    here even the first step runs from root's weights. Only the first ``fit`` broadcasts (as in
    Horovod); the optimizer's slots (momentum...) are not sent: they are equal on every rank,
    having seen the same averaged gradients."""

    def __init__(self, root_rank: int = 0, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done or self.model is None:
            return
        if not 0 <= self.root_rank < size():
            raise ValueError(f"BroadcastGlobalVariablesCallback: root_rank {self.root_rank} is not a rank of "
                             f"this group of {size()} (ranks 0..{size() - 1})")
        variables = list(getattr(self.model, "variables", None) or self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "iterations", None) is not None:
            variables.append(optimizer.iterations)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(Callback):
    """At the end of each epoch, replace each logged number by its average over the ranks (one
    all-reduce), so every rank logs, checkpoints and stops on the same values. Put it before the
    callbacks that read the logs (ModelCheckpoint, EarlyStopping...)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs or size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.floating, np.integer))
                      and not isinstance(v, bool))
        if not keys:
            return
        mean = allreduce(np.array([float(logs[k]) for k in keys], np.float64))
        for k, v in zip(keys, np.asarray(mean).tolist()):
            logs[k] = v


class LearningRateScheduleCallback(Callback):
    """From ``start_epoch`` up to ``end_epoch`` (exclusive; None: to the end), set the optimizer's
    learning rate to ``initial_lr * multiplier(epoch)`` (``multiplier``: a function of the epoch,
    or a number). ``staircase=True``: once per epoch, at its start; ``False``: before every batch,
    with the epoch as a fraction (``epoch + batch / steps_per_epoch``). ``steps_per_epoch``
    defaults to fit's. ``momentum_correction`` is accepted and not applied."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        if initial_lr is None or isinstance(initial_lr, bool) or not np.isfinite(float(initial_lr)):
            raise ValueError(f"{type(self).__name__}: initial_lr must be a number (the learning rate the schedule "
                             f"multiplies; with hvd.size() ranks usually base_lr * hvd.size()), got {initial_lr!r}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch, m=float(multiplier): m)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch, self.verbose = steps_per_epoch, verbose
        self.current_epoch = None

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch):
        lr = self.initial_lr * float(self.multiplier(epoch))
        self.model.optimizer.learning_rate = lr
        return lr

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self._active(epoch) and self.staircase:
            self._set(epoch)

    def _uses(self, hook):
        if hook == "on_train_batch_begin":
            return not self.staircase
        return super()._uses(hook)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or self.current_epoch is None or not self._active(self.current_epoch):
            return
        steps = self.steps_per_epoch or self.params.get("steps")
        if not steps:
            raise ValueError(f"{type(self).__name__}: give steps_per_epoch= (the fit's data does not say how "
                             "many batches an epoch has yet)")
        self._set(self.current_epoch + batch / steps)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """The learning rate grows from ``initial_lr / hvd.size()`` to ``initial_lr`` over the first
    ``warmup_epochs`` epochs, a little before every batch, as Horovod's examples do with a learning
    rate scaled by the number of ranks (a large rate at the very start can diverge)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        n = size()

        def multiplier(epoch):
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr     # exactly initial_lr from here on
            if self.verbose and rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
        super().on_epoch_end(epoch, logs)
