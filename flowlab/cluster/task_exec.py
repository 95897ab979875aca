"""What a task does for ops sent to it: the handlers behind remote tensors and graph partitions.

- ``op``: run one op on this task (inputs: buffers in the message, values stored here, or values
  pulled straight from the task that holds them) and keep the result under a key;
- ``fetch``: send a stored value to whoever asks (another task pulling an input, or a client's
  ``.numpy()``); ``free``: forget stored values (handles that were garbage-collected);
- ``partition``: run this task's part of a graph: nodes in order, values that other tasks need
  sent to them (``value``), values from other tasks waited for; ``abort`` stops a run's waits;
- ``cluster``: the ClusterSpec this task knows (what ``Session("grpc://...")`` asks first);
- ``variables``: which of the named shared variables no client has initialized yet (what a
  non-chief worker polls before it trains, ``tf.report_uninitialized_variables``).

Variables: a ``VarRef`` whose uid starts with ``SHARED`` is this task's variable of that name,
the same storage for every client process that names it (a TF1 variable placed on a ps task, as
TensorFlow's resources are). The first assignment with ``mode="set"`` (its initializer) marks it
initialized; reading or updating it before then is an error naming it. Other uids are private to
the client that made them (it tracks their initialization itself).

Every op, send and receive is recorded in the task's event log. Importing this module is light:
flowlab's engine and numpy load when the first op arrives.
"""
from __future__ import annotations

import threading
import time

from . import events as _events
from .errors import ClusterError
from .protocol import loads
from .server import Reply, handler
from .spec import parse_task, task_name

__all__ = ["VarRef", "SHARED", "local_device", "split_device"]

RECV_TIMEOUT = 120.0      # seconds a partition waits for a value from another task
SHARED = "shared/"        # a VarRef uid with this prefix: the task's variable of that name, shared by every client


class VarRef:
    """A variable named in a graph partition: the task keeps one variable per ``uid``."""
    __slots__ = ("uid", "name", "shape", "dtype")

    def __init__(self, uid, name, shape, dtype):
        self.uid, self.name, self.shape, self.dtype = uid, name, tuple(shape), dtype

    def __getstate__(self):
        return (self.uid, self.name, self.shape, self.dtype)

    def __setstate__(self, s):
        self.uid, self.name, self.shape, self.dtype = s


def split_device(device: str) -> tuple[str, str]:
    """``/job:worker/replica:0/task:1/device:GPU:0`` -> (``/job:worker/task:1``, ``/device:GPU:0``)."""
    parts = [p for p in device.split("/") if p]
    job = next((p[4:] for p in parts if p.startswith("job:")), "localhost")
    task = next((int(p[5:]) for p in parts if p.startswith("task:")), 0)
    dev = next((p for p in parts if p.startswith("device:")), "device:CPU:0")
    return task_name(job, task), "/" + dev


def local_device(device: str) -> str:
    return split_device(device)[1]


_ENGINE = None
INLINE_BYTES = 65536      # an op whose inputs hold at most this much runs on the loop thread


def _engine():
    """flowlab's engine in this process (a worker starts without it)."""
    global _ENGINE
    if _ENGINE is None:
        import flowlab
        flowlab.constant   # noqa: B018 - the first attribute runs flowlab/__init__ in a worker
        from ..core import execute as ex
        from ..core.device import device
        from ..core.tensor import Tensor
        _ENGINE = ex, device, Tensor
    return _ENGINE


def _quick_op(server, msg) -> bool:
    """Whether an ``op`` may run on the loop thread: the engine is loaded (the first op imports
    it), no input is pulled from another task (that waits), and its inputs are small, so it takes
    microseconds and the round trip skips the hand-over to the exec thread."""
    if _ENGINE is None or msg.nbytes > INLINE_BYTES:
        return False
    store = server.store
    total = msg.nbytes
    for ref in msg.body.get("in", ()):
        if ref[0] == "pull":
            return False
        if ref[0] == "key":
            total += _nbytes(store._values.get(ref[1]))
            if total > INLINE_BYTES:
                return False
    return True


def _host(value):
    import numpy as np
    if not isinstance(value, np.ndarray):
        from ..core.backends import to_numpy
        value = to_numpy(value)
    return value


def _nbytes(value) -> int:
    return int(getattr(value, "nbytes", 0) or 0)


def _pull(server, owner: str, key: str, timeout: float = 60.0):
    """The value ``key`` of task ``owner``, fetched straight from it (not through any client)."""
    peers = server.peers()
    if owner not in peers:
        if server.spec is None:
            raise ClusterError(f"{server.name} does not know the cluster yet, so cannot reach {owner}")
        peers.add(owner, server.spec.address_of(owner))
    start = _events.now()
    reply = peers.request(owner, "fetch", {"key": key, "to": server.name}, timeout=timeout)
    value = reply.buffers[0]
    server.log.record("recv", key, start, _events.now(), bytes=_nbytes(value), task=server.name,
                      rank=server.task_index, peer=owner)
    return value


_VARIABLES_LOCK = threading.Lock()   # the loop and exec threads may both make a task's variable


def _variable(server, ref: VarRef, initializing: bool = False):
    """This task's variable for ``ref``, made (zeros, uninitialized) on first use. A shared one must
    have been initialized unless this is its initializer, which may also change its shape."""
    import numpy as np

    key = f"var/{ref.uid}"
    with _VARIABLES_LOCK:
        v = server.store._values.get(key)
        fits = v is not None and v._value.shape == ref.shape and v._value.dtype == np.dtype(ref.dtype)
        if v is None or (initializing and not fits):
            from ..core.tensor import Variable
            v = Variable(np.zeros(ref.shape, ref.dtype), name=ref.name)
            server.store.put(key, v)
            server.store.pop(f"init/{ref.uid}")
        elif not fits:
            raise ClusterError(
                f"variable {ref.name} on {server.name} is {v._value.dtype.name}{list(v._value.shape)}, but this "
                f"graph's {ref.name} is {np.dtype(ref.dtype).name}{list(ref.shape)}: another client made it with "
                f"another shape; give this one another name, or run its initializer to replace it")
    if not initializing and ref.uid.startswith(SHARED) and f"init/{ref.uid}" not in server.store:
        raise ClusterError(
            f"Attempting to use uninitialized value {ref.name} on {server.name}: no client has run its initializer "
            f"yet (the chief runs tf.global_variables_initializer(); other workers wait for it, as "
            f"tf.train.MonitoredTrainingSession(is_chief=False) does)")
    return v


def _initializes(op_name, attrs) -> bool:
    return op_name == "assign" and attrs.get("mode") == "set"


def _attrs(server, attrs, op_name=""):
    if not attrs:
        return attrs
    out = None
    for k, v in attrs.items():
        if isinstance(v, VarRef):
            out = out or dict(attrs)
            out[k] = _variable(server, v, _initializes(op_name, attrs))
    return out or attrs


def _mark_initialized(server, op_name, attrs):
    """After a shared variable's initializer ran here: every client may read it now."""
    if attrs and _initializes(op_name, attrs):
        ref = attrs.get("variable")
        if isinstance(ref, VarRef) and ref.uid.startswith(SHARED):
            server.store.put(f"init/{ref.uid}", True)


def _where(server, error, device, op_name) -> str:
    """Why an op failed on this task, in words that name the task (not "this process"); the
    worker's own source line is left out (the client adds the user's)."""
    text = "\n".join(line for line in str(error).splitlines() if not line.startswith("  at "))
    if text.startswith(f"{op_name}: "):
        text = text[len(op_name) + 2:]
    if text.startswith("no device ") and "this process has: " in text:
        have = text.split("this process has: ")[1].split(";")[0]
        short = ", ".join(h.rpartition("/")[2] for h in have.split(", "))
        return (f"{server.name} has no {device.lstrip('/')} (it has {short}): make logical GPUs there with "
                f"cluster.run(lambda: fl.config.set_logical_devices('GPU', 1)), or (in a session) fall back "
                f"to the CPU with config=tf.ConfigProto(allow_soft_placement=True)")
    return text


@handler("op", inline=_quick_op)
def _op(server, msg):
    """Body: ``op``, ``device`` (this task's part), ``in`` (refs), ``out`` (key), ``free`` (keys);
    buffers: the pickled attrs (when ``attrs``), then input values."""
    ex, device, Tensor = _engine()
    body, store = msg.body, server.store
    for key in body.get("free", ()):
        store.pop(key)
    op = ex.get_op(body["op"])
    wire = loads(msg.buffers[0]) if body.get("attrs") else {}
    attrs = _attrs(server, wire, op.name)
    inputs = []
    for kind, ref, *owner in body["in"]:
        if kind == "buf":
            value = msg.buffers[ref]
        elif kind == "key":
            value = store.get(ref)
        else:            # "pull": the value is on another task
            value = _pull(server, owner[0], ref)
        inputs.append(Tensor(value))
    start = _events.now()
    try:
        with device(body["device"]):
            out = ex.execute(op, inputs, attrs)
    except Exception as e:
        raise ClusterError(f"{op.name} on {server.name}{body['device']}: "
                           f"{_where(server, e, body['device'], op.name)}") from None
    _mark_initialized(server, op.name, wire)
    value = out._value
    store.put(body["out"], value)
    server.log.record("op", op.name, start, _events.now(), bytes=_nbytes(value), task=server.name,
                      rank=server.task_index, device=body["device"])
    return {"shape": list(value.shape), "dtype": value.dtype.str}


@handler("fetch")
def _fetch(server, msg):
    start = _events.now()
    value = _host(server.store.get(msg.body["key"]))
    to = msg.body.get("to", "client")
    server.log.record("send", msg.body["key"], start, _events.now(), bytes=_nbytes(value), task=server.name,
                      rank=server.task_index, peer=to)
    return Reply({}, [value])


@handler("free")
def _free(server, msg):
    for key in msg.body.get("keys", ()):
        server.store.pop(key)


@handler("cluster")
def _cluster(server, msg):
    return {"task": server.name, "cluster": server.spec.as_dict() if server.spec else None}


@handler("variables")
def _variables(server, msg):
    """Body: ``uids`` (shared variables' uids); reply: ``uninitialized``, those no client has
    initialized on this task yet."""
    store = server.store
    return {"uninitialized": [u for u in msg.body.get("uids", ()) if f"init/{u}" not in store]}


@handler("value")
def _value(server, msg):
    """A value another task computed for a partition of this one (the receiving half of a send/recv
    pair): stored under ``key`` for the partition waiting on it."""
    body = msg.body
    server.store.put(body["key"], msg.buffers[0])
    now = _events.now()
    server.log.record("recv", body.get("name", body["key"]), body.get("sent", now), now, bytes=msg.nbytes,
                      task=server.name, rank=server.task_index, peer=body.get("from_task", msg.sender),
                      run=body["key"].partition("/")[0])


@handler("abort")
def _abort(server, msg):
    server.store.put(f"abort/{msg.body['run']}", msg.body.get("why", "aborted"))


def _wait(server, run, key, source, timeout):
    """A value another task sends for this run; stops early if the run is aborted."""
    deadline = time.monotonic() + timeout
    store = server.store
    while True:
        try:
            return store.wait(key, 0.2)
        except TimeoutError:
            why = store.pop(f"abort/{run}")
            if why is not None:
                raise ClusterError(f"{server.name}: the run was stopped while waiting for {key} from {source} "
                                   f"({why})") from None
            if time.monotonic() > deadline:
                raise ClusterError(f"{server.name} waited {timeout:g} s for {key} from {source}, which never "
                                   f"came") from None


@handler("partition", inline=False)
def _partition(server, msg):
    """Run this task's nodes of a graph. Body: ``run`` (id), ``feeds`` {node: buffer}, ``fetch``
    [node], ``soft`` (allow soft placement); buffer 0: the pickled nodes, each
    ``(index, op, attrs, inputs, name, source, device, send_to, recv_from)``."""
    ex, device, Tensor = _engine()
    from ..core.config import logical_device_count

    body, store = msg.body, server.store
    run = body["run"]
    nodes = loads(msg.buffers[0])
    timeout = body.get("timeout", RECV_TIMEOUT)
    env = {int(i): msg.buffers[b] for i, b in body.get("feeds", {}).items()}
    peers = None
    try:
        for index, op_name, attrs, ins, name, source, dev, send_to, recv_from in nodes:
            if recv_from is not None:
                env[index] = _wait(server, run, f"{run}/{index}", recv_from, timeout)
            elif index not in env:
                op = ex.get_op(op_name)
                start = _events.now()
                kind, _, number = dev.rpartition(":")
                if body.get("soft") and int(number) >= logical_device_count(kind.rpartition(":")[2]):
                    dev = "/device:CPU:0"
                try:
                    with device(dev):
                        out = ex.execute(op, [Tensor(env[i]) for i in ins], _attrs(server, attrs, op_name))
                except Exception as e:
                    raise ClusterError(f"node {name} ({op_name}, made at {source}) failed on {server.name}"
                                       f"{dev}: {_where(server, e, dev, op_name)}") from None
                _mark_initialized(server, op_name, attrs)
                env[index] = out._value
                server.log.record("op", name, start, _events.now(), bytes=_nbytes(out._value), task=server.name,
                                  rank=server.task_index, device=dev, run=run)
            for to in send_to:
                if peers is None:
                    peers = server.peers()
                want = body.get("ids", {}).get(to)   # a task restarted on its address has a new server id
                if to not in peers or (want is not None and peers.server_id(to) != want):
                    peers.add(to, server.spec.address_of(to), server_id=want)
                value = _host(env[index])
                start = _events.now()
                peers.request(to, "value", {"key": f"{run}/{index}", "name": name, "from_task": server.name,
                                            "sent": start}, [value], timeout=timeout)
                server.log.record("send", name, start, _events.now(), bytes=_nbytes(value), task=server.name,
                                  rank=server.task_index, peer=to, run=run)
    finally:
        for index, *_, recv_from in nodes:
            if recv_from is not None:
                store.pop(f"{run}/{index}")
        store.pop(f"abort/{run}")
    fetched = [_host(env[int(i)]) for i in body.get("fetch", ())]
    return Reply({}, fetched)


def owner_of(device: str) -> str:
    """The task name of a full device string."""
    job, index = parse_task(split_device(device)[0])
    return task_name(job, index)
