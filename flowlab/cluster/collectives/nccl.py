"""NCCL between GPU ranks: the engine real multi-GPU training uses, behind flowlab's collectives.

When every rank of a group has a GPU of its own, a collective on Tensors that live on a GPU
(``allreduce``, ``broadcast``, ``allgather``, ``reduce_scatter``; so also the gradient all-reduce
of ``MultiWorkerMirroredStrategy``) runs through NCCL (CuPy's ``cupy.cuda.nccl``): the data goes
GPU to GPU and never through the host. Otherwise the same call runs flowlab's host algorithms as
before. It is a transport choice inside the one collective backend (:mod:`._arrays`), not another
entry point: ``algorithm="nccl"`` is what the events and errors then say.

How the choice is made, once per group (the first collective on Tensors of a process that sees
a GPU): every rank gives one row (NCCL usable here? which host? which GPU: ``rank % GPUs``)
and rank 0 adds an NCCL unique id; one host allgather (op ``gpu_setup``) gives every rank every
row, so every rank decides the same (:func:`decide`): NCCL only if every rank can, each on a GPU
no other rank of its host uses (NCCL refuses two ranks on one GPU). Then every rank makes its
``NcclCommunicator(size, id, rank)``. A process without a GPU never asks (nothing changes where
no GPU is); so a group that mixes processes with and without a GPU is not supported: give
every rank a GPU, or none, or set ``FLOWLAB_NCCL=0`` everywhere to keep collectives on the host.

Each NCCL call, like MPI's native ones, first swaps its signature with the peers over the host
channel (a zero-byte tree all-reduce): a rank that called something else (another shape, or a host
tensor where the others had GPU ones) raises the usual mismatch error instead of hanging in NCCL.
Then NCCL runs on CuPy's current stream (ordered after the ops that made the input), and the call
waits for it against its deadline: a timeout aborts the NCCL communicator (it cannot be used
again) and raises ``CollectiveTimeoutError``.

Mapping: float16/32/64, int8/32/64 and uint8 are NCCL types; bool goes as uint8 with max (sum,
max: logical or) or min (prod, min: logical and); int16 has no NCCL type and stays on the host.
``mean`` is NCCL's sum, divided afterwards as on the host (integers rounded toward zero). Uneven
splits (allgather of different row counts, reduce_scatter of rows N does not divide) are one NCCL
broadcast or reduce per rank, in one NCCL group call.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import weakref

import numpy as np

from flowlab.core import backends

from . import tree
from .errors import CollectiveError, CollectiveTimeoutError

__all__ = ["NAME", "SETUP_OP", "on_gpus", "decide", "allreduce", "broadcast", "allgather", "reduce_scatter"]

NAME = "nccl"             # the algorithm name events, signatures and errors show
SETUP_OP = "gpu_setup"    # the one host allgather that decides, per group
_UID_WORDS = 16           # NCCL's unique id: 128 bytes, as 16 int64 words of the setup row
_ROW = 3 + _UID_WORDS     # ready, host, device, uid...

# numpy dtype -> (NCCL type, or None: not an NCCL type) is looked up in _types(); bool is special.
_TYPE_NAMES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
               "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "bool": "NCCL_UINT8"}
_OP_NAMES = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN", "prod": "NCCL_PROD"}
_BOOL_OPS = {"sum": "NCCL_MAX", "mean": "NCCL_MAX", "max": "NCCL_MAX", "min": "NCCL_MIN", "prod": "NCCL_MIN"}


class _Group:
    """What one rank knows about its group's GPUs: ``why`` None when the group uses NCCL (else why
    not), this rank's ``device`` and its ``comm`` (an NcclCommunicator), ``broken`` after an abort."""

    __slots__ = ("why", "device", "comm", "broken", "__weakref__")

    def __init__(self, why, device=None, comm=None):
        self.why, self.device, self.comm, self.broken = why, device, comm, None


_groups: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # Communicator -> _Group
_lock = threading.Lock()


# -- the choice ------------------------------------------------------------------------------------
def on_gpus(x, comm, timeout) -> bool:
    """Whether this rank's collective on ``x`` (a backend array) runs through NCCL. Called by every
    rank for every collective on Tensors, so that in a process that sees a GPU every rank of the
    group takes part in the group's one setup allgather at the same call. Free where no GPU is."""
    if comm.size == 1 or backends.gpu_count() == 0:
        return False
    group = _groups.get(comm)
    if group is None:
        group = _setup(comm, timeout)
    if group.why is not None or type(x) is np.ndarray or not backends.gpu_backend().owns(x):
        return False
    return x.dtype.name in _TYPE_NAMES


def placed(x, comm):
    """``x`` on the GPU this rank's NCCL communicator uses (itself when it is there already)."""
    return backends.gpu_backend().put(x, _groups[comm].device)


def why_not(comm) -> str | None:
    """Why ``comm``'s group does not use NCCL (None: it does; also None before its setup)."""
    group = _groups.get(comm)
    return None if group is None else group.why


def decide(rows) -> str | None:
    """From every rank's setup row (``ready, host, device``, ...: ``rows[r]`` is rank r's), None when
    the group can use NCCL, else the reason it cannot (the same on every rank)."""
    rows = np.asarray(rows)
    missing = [r for r in range(len(rows)) if not rows[r, 0]]
    if missing:
        return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                f"{'have' if len(missing) > 1 else 'has'} no GPU with NCCL")
    seen: dict = {}
    for r in range(len(rows)):
        key = (int(rows[r, 1]), int(rows[r, 2]))
        if key in seen:
            return (f"ranks {seen[key]} and {r} would share GPU {key[1]} of one host (rank % GPUs), and NCCL "
                    f"needs a GPU of its own for each rank")
        seen[key] = r
    return None


def _setup(comm, timeout) -> _Group:
    """The group's one setup allgather, the decision, and this rank's NCCL communicator."""
    from ._arrays import _allgather
    with _lock:
        group = _groups.get(comm)
        if group is not None:
            return group
    nccl, device = _cupy_nccl(), _device_for(comm.rank)
    row = np.zeros((1, _ROW), np.int64)
    row[0, :3] = (nccl is not None, _host_id(), device)
    if comm.rank == 0 and nccl is not None:
        row[0, 3:] = np.frombuffer(bytes(nccl.get_unique_id()), np.int64)
    rows = _allgather(row, [1] * comm.size, "ring", comm, timeout, (1, _ROW), SETUP_OP)
    why = decide(rows)
    group = _Group(why)
    if why is None:
        group.device = device
        uid = rows[0, 3:].tobytes()
        try:
            with backends.gpu_backend().xp.cuda.Device(device):
                group.comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        except Exception as e:  # noqa: BLE001 - NCCL's own error, with what was being done
            raise CollectiveError(f"{SETUP_OP} on rank {comm.rank}: NCCL could not start on GPU {device} "
                                  f"({type(e).__name__}: {e}); set FLOWLAB_NCCL=0 on every rank to keep the "
                                  f"collectives on the host", SETUP_OP, 0, comm.rank) from e
    with _lock:
        _groups[comm] = group
    return group


def _cupy_nccl():
    """CuPy's NCCL module where this process can use it, else None (no CuPy, no NCCL library, a
    stand-in GPU backend, or ``FLOWLAB_NCCL=0``)."""
    if os.environ.get("FLOWLAB_NCCL", "1") == "0":
        return None
    from flowlab.core.backends import cupy_backend
    if backends.gpu_backend() is not cupy_backend or cupy_backend.xp is None:
        return None
    get = getattr(cupy_backend, "nccl", None)   # cupy_backend.nccl(): cupy.cuda.nccl or None
    return None if get is None else get()


def _device_for(rank: int) -> int:
    """The GPU rank ``rank`` uses: ``rank % GPUs`` of the ones this process sees."""
    visible = backends.visible_gpus()
    return int(visible[rank % len(visible)]) if visible else -1


def _host_id() -> int:
    """A number naming this machine (host name and boot id), the same in all its processes."""
    text = socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            text += f.read().strip()
    except OSError:
        pass
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


# -- the collectives (the algorithm interface of ring, tree, naive: buffers are GPU arrays) ----------
def allreduce(ex, buf, bounds, ufunc, src=None):
    group, nccl, xp = _check(ex)
    dtype, op = _types(nccl, buf, ex.fields["reduce"])
    src = buf if src is None else src
    with xp.cuda.Device(group.device):
        stream = xp.cuda.get_current_stream()
        group.comm.allReduce(src.data.ptr, buf.data.ptr, buf.size, dtype, op, stream.ptr)
        _wait(ex, group, stream)


def broadcast(ex, buf, root):
    group, nccl, xp = _check(ex)
    dtype, _ = _types(nccl, buf, None)
    with xp.cuda.Device(group.device):
        stream = xp.cuda.get_current_stream()
        group.comm.bcast(buf.data.ptr, buf.size, dtype, root, stream.ptr)
        _wait(ex, group, stream)


def allgather(ex, buf, bounds):
    """Rank r's block is at ``buf[bounds[r]:bounds[r + 1]]``; every block ends up everywhere."""
    group, nccl, xp = _check(ex)
    dtype, _ = _types(nccl, buf, None)
    counts = [bounds[i + 1] - bounds[i] for i in range(ex.size)]
    k, base = buf.itemsize, buf.data.ptr
    with xp.cuda.Device(group.device):
        stream = xp.cuda.get_current_stream()
        if len(set(counts)) == 1:   # in place: NCCL allows sendbuff == recvbuff + rank * count
            group.comm.allGather(base + bounds[ex.rank] * k, base, counts[0], dtype, stream.ptr)
        else:                       # uneven: each rank broadcasts its block, in one group call
            nccl.groupStart()
            for peer in range(ex.size):
                if counts[peer]:
                    at = base + bounds[peer] * k
                    group.comm.broadcast(at, at, counts[peer], dtype, peer, stream.ptr)
            nccl.groupEnd()
        _wait(ex, group, stream)


def reduce_scatter(ex, buf, bounds, ufunc, src=None):
    """Rank r's share of the reduction lands in ``buf[bounds[r]:bounds[r + 1]]``."""
    group, nccl, xp = _check(ex)
    dtype, op = _types(nccl, buf, ex.fields["reduce"])
    src = buf if src is None else src
    counts = [bounds[i + 1] - bounds[i] for i in range(ex.size)]
    k, send, recv = buf.itemsize, src.data.ptr, buf.data.ptr
    with xp.cuda.Device(group.device):
        stream = xp.cuda.get_current_stream()
        if len(set(counts)) == 1:
            group.comm.reduceScatter(send, recv + bounds[ex.rank] * k, counts[0], dtype, op, stream.ptr)
        else:                       # uneven: one reduce per block, to the rank that keeps it
            nccl.groupStart()
            for peer in range(ex.size):
                if counts[peer]:
                    off = bounds[peer] * k
                    group.comm.reduce(send + off, recv + off, counts[peer], dtype, op, peer, stream.ptr)
            nccl.groupEnd()
        _wait(ex, group, stream)


def _check(ex):
    """Swap this call's signature with every peer over the host channel (a zero-byte tree
    all-reduce, events and mismatch errors as for any host call); the group, NCCL and CuPy."""
    group = _groups[ex.comm]
    if group.broken:
        raise CollectiveError(f"{ex.name} #{ex.seq} on rank {ex.rank}: this group's NCCL communicator is "
                              f"unusable since {group.broken}; make a new group", ex.name, ex.seq, ex.rank)
    tree.allreduce(ex, np.zeros(0, np.int8), [0] * (ex.size + 1), np.add)
    return group, _cupy_nccl(), backends.gpu_backend().xp


def _types(nccl, buf, reduce):
    """(NCCL data type, NCCL reduction) of ``buf`` and ``reduce``."""
    name = buf.dtype.name
    ops = _BOOL_OPS if name == "bool" else _OP_NAMES
    return getattr(nccl, _TYPE_NAMES[name]), (None if reduce is None else getattr(nccl, ops[reduce]))


def _wait(ex, group, stream):
    """Wait for the NCCL work just queued on ``stream``, until the call's deadline."""
    from .mpi import _poll
    done = stream.record()
    if not _poll(lambda: done.done, ex.deadline):
        group.broken = f"{ex.name} #{ex.seq} timed out in NCCL"
        ex.st.failed_seq = max(ex.st.failed_seq, ex.seq)
        try:
            group.comm.abort()
        except Exception:  # noqa: BLE001 - an old NCCL without abort: the communicator is lost anyway
            pass
        raise CollectiveTimeoutError(
            f"{ex.name} #{ex.seq} (NCCL) on rank {ex.rank} timed out after {ex.timeout:g} s: some rank is not "
            f"calling it (or is stopped); NCCL cannot say which", ex.name, ex.seq, ex.rank, (), ex.timeout)
