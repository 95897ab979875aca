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
average is then one all-reduce node of the step's graph, the node MultiWorkerMirroredStrategy's
traced step uses (flowlab/distribute/_traced.py).

Learning rate: each step now averages the gradients of ``size()`` batches, so the effective batch
is ``size()`` times larger. The usual convention (as in Horovod's own examples) is to scale the
learning rate by ``size()``: ``fl.optimizers.SGD(0.01 * hvd.size())``, often with a few epochs of
warm-up, and to divide the number of steps per epoch by ``size()``.
"""
from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["init", "is_initialized", "shutdown", "rank", "size", "local_rank", "local_size", "allreduce",
           "allgather", "broadcast", "broadcast_variables", "DistributedOptimizer", "Average", "Sum", "Adasum",
           "Compression"]
# the Keras callbacks (below) are public as ``hvd.callbacks.*`` (flowlab/horovod/callbacks.py), as in Horovod

Average, Sum, Adasum = "average", "sum", "adasum"
_comm = None
_tls = threading.local()      # init() in a thread of a LocalGroup: that thread's rank
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "FLOWLAB_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "FLOWLAB_LOCAL_SIZE")


def init(comm=None) -> None:
    """Join this process's group (``comm``: a communicator to use instead of the default)."""
    global _comm
    from ..cluster.collectives import current
    _comm = _tls.comm = current() if comm is None else comm


def is_initialized() -> bool:
    return _comm is not None


def shutdown() -> None:
    """Forget the group (``init`` may be called again)."""
    global _comm
    _comm = _tls.comm = None


def _group():
    comm = getattr(_tls, "comm", None) or _comm
    if comm is None:
        raise ValueError("Horovod has not been initialized: call hvd.init() first")
    return comm


def rank() -> int:
    return _group().rank


def size() -> int:
    return _group().size


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
    return _env_int(_LOCAL_SIZE_VARS, size())


def allreduce(tensor, average=None, name=None, op=None):
    """``tensor`` averaged (the default) or summed over every rank."""
    if op is None:
        op = Average if average is None or average else Sum
    return _collectives().allreduce(tensor, op="mean" if op == Average else "sum", comm=_group())


def allgather(tensor, name=None):
    """Every rank's ``tensor`` concatenated along the first axis, in rank order."""
    return _collectives().allgather(tensor, comm=_group())


def broadcast(tensor, root_rank: int = 0, name=None):
    return _collectives().broadcast(tensor, root=root_rank, comm=_group())


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Give every variable the value it has on ``root_rank`` (in place, on every rank)."""
    bcast = _collectives().broadcast
    comm = _group()
    for v in variables:
        old = np.array(v.numpy(), order="C")     # (ascontiguousarray would make a scalar 1-d)
        v.assign(np.asarray(bcast(old, root=root_rank, comm=comm)).reshape(old.shape))


def _collectives():
    from ..cluster import collectives
    return collectives


# -- the optimizer -------------------------------------------------------------------------------
class _Ranks:
    """This module's ranks as a group the all-reduce graph node (distribute/_traced.py) reduces
    over: the communicator is looked up each time the node runs (``init`` may be called again)."""

    _algorithm = "ring"
    _timeout = None

    @property
    def _comm(self):
        return _group()

    def _collective_note(self):
        return f"in the gradient all-reduce of hvd.DistributedOptimizer, on rank {rank()} of {size()}"


_RANKS = _Ranks()


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
        out = list(grads)
        if _group().size == 1:
            return out
        live = [i for i, g in enumerate(out) if g is not None]
        if not live:
            return out
        from ..core.tensor import convert_to_tensor
        from ._traced import cross_process_reduce
        packed = [self._hvd_compression.compress(convert_to_tensor(out[i])) for i in live]
        reduced = cross_process_reduce(_RANKS, [t for t, _ in packed], "mean" if self._hvd_op == Average else "sum")
        for i, r, (_, ctx) in zip(live, reduced, packed):
            out[i] = self._hvd_compression.decompress(r, ctx)
        return out


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
    if op not in (Average, Sum):
        raise NotImplementedError(f"DistributedOptimizer: op={op!r}: flowlab.horovod averages (hvd.Average) "
                                  "or sums (hvd.Sum) gradients; Adasum is not implemented")
    if backward_passes_per_step != 1:
        raise NotImplementedError(f"DistributedOptimizer: backward_passes_per_step={backward_passes_per_step}: "
                                  "flowlab reduces the gradients at every step; to accumulate gradients over "
                                  "several batches, use a larger batch instead")
    if gradient_predivide_factor != 1.0:
        raise NotImplementedError("DistributedOptimizer: gradient_predivide_factor must be 1.0 in flowlab "
                                  "(the average divides once, after the sum)")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError(f"DistributedOptimizer: compression must be hvd.Compression.none or "
                         f"hvd.Compression.fp16, got {compression!r}")
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
