"""Horovod's API over flowlab's collectives: ``import flowlab.horovod as hvd``.

>>> import flowlab.horovod as hvd
>>> hvd.init()
>>> hvd.rank(), hvd.size()
(0, 1)

``init()`` picks the communicator collectives use in this process: the cluster's when it runs in
a LocalCluster worker (``cluster.run(fn)``) or under ``flowlab run -np N``, MPI's world under
``mpiexec``, a group of one otherwise. All ranks of this module's groups run on one machine, so
``local_rank() == rank()`` except under ``mpiexec`` across hosts (read from MPI's environment).

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
           "allgather", "broadcast", "broadcast_variables", "DistributedOptimizer", "Average", "Sum", "callbacks"]

Average, Sum = "average", "sum"
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
_tls = threading.local()      # init() in a thread of a LocalGroup: that thread's rank


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


class _Distributed:
    """Mixed into a copy of the optimizer's class: gradients are averaged (or summed) over the
    ranks with one all-reduce before the wrapped class applies them."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        reduced = self.reduce_gradients([g for g, _ in pairs])
        return super().apply_gradients(list(zip(reduced, [v for _, v in pairs])), *args, **kwargs)

    def reduce_gradients(self, grads):
        """The gradients averaged (or summed) over every rank, in one all-reduce; None stays None."""
        comm = _group()
        if comm.size == 1:
            return list(grads)
        from ..core.tensor import convert_to_tensor
        live = [i for i, g in enumerate(grads) if g is not None]
        arrays = [np.asarray(convert_to_tensor(grads[i])._value) for i in live]
        if not arrays:
            return list(grads)
        dtype = np.result_type(*arrays)
        flat = np.concatenate([a.astype(dtype, copy=False).ravel() for a in arrays])
        flat = _collectives().allreduce(flat, op="mean" if self._hvd_op == Average else "sum", comm=comm)
        out, at = list(grads), 0
        for i, a in zip(live, arrays):
            out[i] = convert_to_tensor(flat[at:at + a.size].reshape(a.shape).astype(a.dtype, copy=False))
            at += a.size
        return out


_classes: dict = {}


def DistributedOptimizer(optimizer, name=None, op=Average, compression=None, backward_passes_per_step=1):
    """``optimizer`` made distributed: an instance of a subclass of its class (so ``compile`` and
    checkpoints take it as the optimizer it was) that shares its state and whose
    ``apply_gradients`` (hence ``minimize``) first averages every gradient over the ranks."""
    cls = type(optimizer)
    dist = _classes.get(cls)
    if dist is None:
        dist = _classes[cls] = type(f"Distributed{cls.__name__}", (_Distributed, cls), {"__module__": __name__})
    out = dist.__new__(dist)
    out.__dict__.update(optimizer.__dict__)
    out._hvd_op = op
    return out


def _callbacks_module():
    import types
    try:
        from ..nn.keras.callbacks import Callback
    except ImportError:      # fit's callbacks are not there: a plain base with the same hooks
        Callback = object

    class BroadcastGlobalVariablesCallback(Callback):
        """At the start of ``fit``, give every rank the model's (and optimizer's) weights from
        ``root_rank``, so all ranks start from the same state."""

        def __init__(self, root_rank: int = 0):
            if Callback is not object:
                super().__init__()
            self.root_rank = root_rank
            self.model = None
            self.done = False

        def on_train_begin(self, logs=None):
            if self.done or self.model is None:
                return
            variables = list(getattr(self.model, "variables", None) or self.model.weights)
            broadcast_variables(variables, self.root_rank)
            self.done = True

    class MetricAverageCallback(Callback):
        """At each epoch's end, average the logged metrics over the ranks."""

        def on_epoch_end(self, epoch, logs=None):
            if logs:
                for k, v in list(logs.items()):
                    if isinstance(v, (int, float, np.floating)):
                        logs[k] = float(allreduce(np.asarray(float(v))))

    mod = types.ModuleType(__name__ + ".callbacks", "Callbacks for fit that keep the ranks in step.")
    mod.BroadcastGlobalVariablesCallback = BroadcastGlobalVariablesCallback
    mod.MetricAverageCallback = MetricAverageCallback
    return mod


def __getattr__(name):
    if name == "callbacks":
        import sys
        mod = _callbacks_module()
        sys.modules[mod.__name__] = mod
        globals()["callbacks"] = mod
        return mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
