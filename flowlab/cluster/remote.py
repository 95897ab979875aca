"""Remote eager execution: ops placed on a cluster's task run there and return handles.

>>> import flowlab as fl
>>> with fl.cluster.LocalCluster(workers=2) as cluster:          # doctest: +SKIP
...     x = fl.constant([1.0, 2.0])
...     with fl.device("/job:worker/task:1"):
...         y = x * 10.0                 # runs on worker 1: y is a RemoteTensor
...     (y + 1.0).numpy()                # follows y to worker 1, then fetches the result
array([11., 21.], dtype=float32)

While a cluster is open it registers :data:`INTERPRETER`, a :class:`RemoteInterpreter`, with core
(``core.device.set_remote_interpreter``): core's eager interpreter places each op and hands it
every op placed on another task and every op with a :class:`RemoteTensor` input. An op placed on
a task runs there: local inputs travel in the op's message, a handle held by that task is used in
place, and a handle held by another task is pulled by the task that runs the op straight from the
task that holds it (never through this process). An op placed here fetches its remote inputs first.
A handle's value stays on its task until ``.numpy()`` (or any use that needs the numbers here);
when the handle is garbage-collected the task forgets the value (the keys are sent with the next
op to that task). Open tapes see every op it runs, so gradients flow through ops on tasks (a
gradient rule's ops follow their remote inputs to the task).
"""
from __future__ import annotations

import itertools
import os
import threading
import weakref

import numpy as np

from ..core import device as _device
from ..core.function import set_graph_partitioner
from ..core.backends import to_numpy
from ..core.errors import InvalidArgumentError, did_you_mean, source_line
from ..core.execute import describe, execute, op_error
from ..core.interpreters import Interpreter
from ..core.tape import record_gradient, record_op
from ..core.tensor import Tensor, readonly_numpy
from .errors import ClusterError, RemoteError
from .partition import Connection, StagedPlan
from .protocol import dumps
from .spec import parse_task, task_name
from .task_exec import split_device

__all__ = ["RemoteTensor", "RemoteInterpreter", "INTERPRETER", "attach", "detach", "connections"]

FREE_BATCH = 256       # forgotten handles per task after which a free message goes out on its own


class _Meta:
    """The shape and dtype of a value that lives on another task (what shape rules read)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __array__(self, *args, **kwargs):
        raise TypeError("this value lives on another task: call .numpy() on the RemoteTensor to fetch it")


class _Conn:
    """One cluster as remote eager execution sees it: a client, its tasks, handles to free."""

    def __init__(self, client, tasks, name):
        self.client, self.tasks, self.name = client, set(tasks), name
        self.open = True
        self.timeout = None if getattr(client, "health", None) is not None else 600.0   # never forever
        self._ids = itertools.count()
        self._prefix = f"r{os.getpid()}-{os.urandom(3).hex()}-"
        self._free: dict[str, list] = {}
        self._free_lock = threading.RLock()
        self._partitions = None    # the partition.Connection traced functions' plans run on

    def partitions(self) -> Connection:
        """This cluster as graph partitions see it (made on first use; shares the client and tasks)."""
        if self._partitions is None:
            self._partitions = Connection(self.client, None, "/job:localhost/task:0", owned=False,
                                          monitored=self.timeout is None, tasks=self.tasks)
        return self._partitions

    def new_key(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def forget(self, task, key):   # from a finalizer: any thread, maybe inside take_frees (RLock)
        if self.open:
            with self._free_lock:
                self._free.setdefault(task, []).append(key)

    def take_frees(self, task) -> list:
        with self._free_lock:
            keys = self._free.get(task)
            if not keys:
                return []
            self._free[task] = []
            return keys

    def flush(self) -> None:
        """Tell every task which values no handle needs any more."""
        for task in list(self._free):
            keys = self.take_frees(task)
            if keys:
                self.client.request(task, "free", {"keys": keys}, timeout=30.0)


_conns: list[_Conn] = []
_lock = threading.Lock()


def attach(client, tasks, name: str = "cluster") -> _Conn:
    """Make ``tasks`` (reached through ``client``) places where eager ops may run."""
    conn = _Conn(client, tasks, name)
    with _lock:
        _conns.append(conn)
        _device.set_remote_interpreter(INTERPRETER)
        set_graph_partitioner(_staged_plan)
    return conn


def detach(conn: _Conn) -> None:
    """Forget a cluster (closed); with none left, remote placements raise RemoteDeviceError again."""
    with _lock:
        conn.open = False
        if conn._partitions is not None:
            conn._partitions.closed = True
        if conn in _conns:
            _conns.remove(conn)
        if not _conns:
            _device.set_remote_interpreter(None)
            set_graph_partitioner(None)


def connections() -> list:
    return list(_conns)


def _conn_for(task, op_name) -> _Conn:
    for conn in reversed(_conns):
        if task in conn.tasks:
            return conn
    known = sorted({t for c in _conns for t in c.tasks})
    where = source_line()
    raise _device.RemoteDeviceError(
        f"{op_name}: no open cluster has the task {task} (the open ones have {known}){did_you_mean(task, known)} "
        f"Check the job name and task number of the fl.device string" + (f"\n  at {where}" if where else ""))


def _staged_plan(graph, fetches, feeds, elsewhere) -> StagedPlan:
    """Core's graph partitioner while a cluster is open: a traced function with nodes on tasks."""
    return StagedPlan(graph, fetches, feeds, elsewhere, _partition_connection)


def _partition_connection(tasks) -> Connection:
    for conn in reversed(_conns):
        if tasks <= conn.tasks:
            return conn.partitions()
    task = sorted(tasks - {t for c in _conns for t in c.tasks} or tasks)[0]
    return _conn_for(task, "a traced function").partitions()   # raises, naming the task


class RemoteTensor(Tensor):
    """A tensor whose value lives on a cluster task: it has a shape, a dtype and a device (that
    task's), and ops accept it as any tensor. ``.numpy()`` fetches the value (once; then cached)."""

    __slots__ = ("_task", "_key", "_conn", "_cache")

    @property
    def task(self) -> str:
        """The task that holds the value, e.g. ``/job:worker/task:1``."""
        return self._task

    def numpy(self):
        """The value, fetched from its task (a read-only numpy array; a scalar for 0-d)."""
        return readonly_numpy(self._fetch())

    def _fetch(self):
        if self._cache is None:
            conn = self._conn
            if not conn.open:
                raise ClusterError(f"the cluster that held this tensor ({self._task}) is closed, and its value "
                                   "with it", self._task)
            reply = conn.client.request(self._task, "fetch", {"key": self._key, "to": "client"},
                                        timeout=conn.timeout)
            value = reply.buffers[0]
            self._cache = value if value.shape == self._value.shape else value.reshape(self._value.shape)
        return self._cache

    def _local(self) -> Tensor:
        return Tensor(self._fetch())

    def __array__(self, dtype=None, copy=None):
        value = self._fetch()
        if dtype is not None or copy:
            return np.array(value, dtype=dtype, copy=True)
        return value

    def __bool__(self):
        return bool(self._fetch())

    def __float__(self):
        return float(self._fetch())

    def __int__(self):
        return int(self._fetch())

    def __index__(self):
        return int(self._local().__index__())

    def __repr__(self):
        return (f"<fl.RemoteTensor: shape={tuple(self._value.shape)}, dtype={self.dtype.name}, "
                f"on {self._task} (.numpy() fetches it)>")

    def __reduce__(self):
        return Tensor, (np.asarray(self._fetch()),)


def _handle(conn, task, key, device, shape, dtype) -> RemoteTensor:
    h = object.__new__(RemoteTensor)
    h._value = _Meta(shape, dtype)
    h._device = device
    h._task, h._key, h._conn, h._cache = task, key, conn, None
    weakref.finalize(h, conn.forget, task, key)
    return h


class RemoteInterpreter(Interpreter):
    """Runs ops where placement put them, while a cluster is open: core's eager interpreter hands
    it each op placed on another task, and each op with a RemoteTensor input (then ``device`` may
    be here: None is the default CPU). Every op it runs is shown to the open tapes."""

    handle_type = RemoteTensor

    def process(self, op, inputs, attrs, device=None):
        if _device.is_local(device):
            return _here(op, inputs, attrs)
        out = _on_task(op, inputs, attrs, device)
        record_op(op, inputs, attrs, out)
        return out

    def __repr__(self):
        return "<remote interpreter>"


INTERPRETER = RemoteInterpreter()


def _here(op, inputs, attrs):
    """An op placed here: fetch its remote inputs (a tape sees each fetch as an identity), run it."""
    local = []
    for x in inputs:
        if x.__class__ is RemoteTensor:
            value = x._local()
            record_gradient(f"fetch from {x._task}", (x,), value, _identity)
            x = value
        local.append(x)
    return execute(op, local, attrs)


def _identity(g):
    return g


def _on_task(op, inputs, attrs, device):
    """Run ``op`` on the task of ``device`` (another task's); its result is a handle."""
    task, dev = split_device(device)
    task = task_name(*parse_task(task))
    conn = _conn_for(task, op.name)
    try:
        op.shape_rule(*inputs, **attrs)
    except InvalidArgumentError as e:
        raise op_error(op, inputs, attrs, f"{e} (placed on {task})") from None
    refs, bufs = [], []
    if attrs:
        bufs.append(dumps(dict(attrs)))
    for x in inputs:
        if x.__class__ is RemoteTensor:
            if x._conn is not conn:
                raise op_error(op, inputs, attrs, f"an input lives on {x._task} of another cluster "
                                                  f"({'closed' if not x._conn.open else x._conn.name}); fetch it "
                                                  f"with .numpy() first")
            refs.append(["key", x._key] if x._task == task else ["pull", x._key, x._task])
        else:
            refs.append(["buf", len(bufs)])
            bufs.append(to_numpy(x._value))      # 0-d stays 0-d (np.ascontiguousarray would make it 1-d)
    key = conn.new_key()
    body = {"op": op.name, "device": dev, "in": refs, "out": key, "attrs": bool(attrs),
            "free": conn.take_frees(task)}
    try:
        reply = conn.client.request(task, "op", body, bufs, timeout=conn.timeout)
    except RemoteError as e:
        where = source_line()
        raise InvalidArgumentError(
            f"{e.remote_message}\n  inputs: {', '.join(describe(t) for t in inputs)}"
            + (f"\n  at {where}" if where else ""), op=op.name, source=where) from None
    frees = conn._free.get(task)
    if frees and len(frees) >= FREE_BATCH:
        conn.client.request(task, "free", {"keys": conn.take_frees(task)}, timeout=30.0)
    job, index = parse_task(task)
    full = f"/job:{job}/replica:0/task:{index}{dev}"
    return _handle(conn, task, key, full, reply.body["shape"], reply.body["dtype"])
