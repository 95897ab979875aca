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
        from ..core.graph import ASSIGN
        from ..core.tensor import Tensor
        _ENGINE = ex, device, Tensor, ASSIGN
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


def _variable(server, ref: VarRef, initializing: bool = False, check: bool = True):
    """This task's variable for ``ref``, made (zeros, uninitialized) on first use. A shared one must
    have been initialized unless this is its initializer, which may also change its shape (or
    ``check`` is false: its initializer runs earlier in the same partition)."""
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
    if check and not initializing and ref.uid.startswith(SHARED) and f"init/{ref.uid}" not in server.store:
        raise ClusterError(
            f"Attempting to use uninitialized value {ref.name} on {server.name}: no client has run its initializer "
            f"yet (the chief runs tf.global_variables_initializer(); other workers wait for it, as "
            f"tf.train.MonitoredTrainingSession(is_chief=False) does)")
    return v


def _initializes(op, attrs) -> bool:
    """Whether ``op`` with ``attrs`` is a variable's initializer (an assignment with mode "set")."""
    return op is _ENGINE[3] and attrs.get("mode") == "set"


def _attrs(server, attrs, op):
    if not attrs:
        return attrs
    out = None
    for k, v in attrs.items():
        if isinstance(v, VarRef):
            out = out or dict(attrs)
            out[k] = _variable(server, v, _initializes(op, attrs))
    return out or attrs


def _mark_initialized(server, op, attrs):
    """After a shared variable's initializer ran here: every client may read it now."""
    if attrs and _initializes(op, attrs):
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
    ex, device, Tensor, _ = _engine()
    body, store = msg.body, server.store
    for key in body.get("free", ()):
        store.pop(key)
    op = ex.get_op(body["op"])
    wire = loads(msg.buffers[0]) if body.get("attrs") else {}
    attrs = _attrs(server, wire, op)
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
    _mark_initialized(server, op, wire)
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


PLANS_KEPT = 32           # compiled partitions a task keeps (a session running the same fetches reuses one)


def _failed(server, name, op_name, source, dev, error):
    return ClusterError(f"node {name} ({op_name}, made at {source}) failed on {server.name}{dev}: "
                        f"{_where(server, error, dev, op_name)}")


class _TaskPlan:
    """A partition as this task runs it: a core Graph of its nodes, with a ``recv`` node before the
    first reader of a value from another task and a ``send`` node after each value another task
    needs (cluster/sendrecv.py), compiled by core's executor (``compile_plan``, no graph passes:
    every node runs as its author placed it), each kernel wrapped to record its event, mark a
    shared variable initialized, and name the node, its op, its source and this task if it fails.
    ``variables``: (ref, initializing, checked, variable compiled in, node's description) of each
    node that names one, checked again before every run (a shared variable must be initialized;
    if another client replaced it, the partition is compiled again)."""

    def __init__(self, server, entries, fetch, soft):
        ex, device, *_ = _engine()
        from ..core.config import logical_device_count
        from ..core.device import resolve
        from ..core.executor import compile_plan
        from ..core.graph import Graph
        from .sendrecv import RECV, SEND

        self.server, self.feeds, self.recvs, self.variables = server, [], [], []
        self._about = {}           # id(node) -> (task device, wire attrs)
        graph = Graph(f"partition of {server.name}")
        out, initialized = {}, set()
        for e in entries:
            kind, index = e[0], e[1]
            if kind == "feed":
                out[index] = graph.placeholder(e[4], shape=e[3], name=f"feed_{index}")
                self.feeds.append(index)
                continue
            if kind == "recv":
                out[index] = graph.add_node(RECV, [], {"key": index, "source": e[6], "shape": e[4], "dtype": e[5]},
                                            name=f"recv_{index}")
                self.recvs.append(index)
                continue
            _, _, op_name, wire, ins, controls, name, source, dev, send_to = e
            kind, _, number = dev.rpartition(":")
            if soft and int(number) >= logical_device_count(kind.rpartition(":")[2]):
                dev = "/device:CPU:0"
            try:
                op = ex.get_op(op_name)
                resolve(dev)
                attrs = dict(wire) if wire else {}
                for k, v in attrs.items():
                    if isinstance(v, VarRef):
                        init = _initializes(op, wire)
                        check = v.uid not in initialized      # not initialized earlier in this partition
                        attrs[k] = _variable(server, v, init, check)
                        self.variables.append((v, init, check, attrs[k], (name, op_name, source, dev)))
                        initialized.update((v.uid,) if init else ())
                with device(dev):
                    t = graph.add_node(op, [out[i] for i in ins], attrs, name=f"n{index}")
            except Exception as err:  # noqa: BLE001 - becomes an error naming the node and this task
                raise _failed(server, name, op_name, source, dev, err) from None
            node = t.node
            node.control_inputs = [out[i].node for i in controls if i in out and i not in self.feeds]
            node.source, node.name = source, name
            self._about[id(node)] = (dev, wire)
            out[index] = t
            for to in send_to:
                graph.add_node(SEND, [t], {"key": index, "to": to, "name": name}, name=f"send_{index}")
        self.plan = compile_plan(graph, [out[i] for i in fetch], [out[i] for i in self.feeds], passes=(),
                                 around=self._around)

    def _around(self, node, kernel):
        """The kernel of ``node`` as this task runs it: its event, its error, a variable marked initialized."""
        from ..core.errors import OpError
        from ..core.execute import explain
        from ..core.tensor import Tensor
        from .sendrecv import RECV, SEND, current

        if node.op is SEND or node.op is RECV:
            return kernel
        server, op, name, source = self.server, node.op, node.name, node.source
        dev, wire = self._about[id(node)]
        record, task, rank, now = server.log.record, server.name, server.task_index, _events.now
        mark = _initializes(op, wire)

        def run(*args, **attrs):
            start = now()
            try:
                value = kernel(*args, **attrs)
            except ClusterError:
                raise
            except Exception as err:  # noqa: BLE001 - becomes an error naming the node and this task
                if not isinstance(err, OpError):
                    err = explain(op, [Tensor(a) for a in args], attrs, err)
                raise _failed(server, name, op.name, source, dev, err) from None
            if mark:
                _mark_initialized(server, op, wire)
            record("op", name, start, now(), bytes=_nbytes(value), task=task, rank=rank, device=dev,
                   run=current().run)
            return value
        return run

    def current(self) -> bool:
        """Before a run: whether every variable is still the one compiled in (errors if a shared one
        must be initialized and is not)."""
        for ref, init, check, bound, (name, op_name, source, dev) in self.variables:
            try:
                v = _variable(self.server, ref, init, check)
            except Exception as err:  # noqa: BLE001 - names the node and this task
                raise _failed(self.server, name, op_name, source, dev, err) from None
            if v is not bound:
                return False
        return True


def _task_plan(server, nodes_buffer, fetch, soft) -> _TaskPlan:
    """The compiled partition for these entries: made once, then found again while the client sends
    the same partition (a Session running the same fetches in a loop)."""
    key = (bytes(nodes_buffer), tuple(fetch), bool(soft))
    with _VARIABLES_LOCK:
        plans = server.state(__name__).setdefault("plans", {})   # (entries, fetch, soft) -> _TaskPlan
        plan = plans.get(key)
    if plan is not None and plan.current():
        return plan
    plan = _TaskPlan(server, loads(nodes_buffer), [int(i) for i in fetch], soft)
    with _VARIABLES_LOCK:
        plans.pop(key, None)
        while len(plans) >= PLANS_KEPT:
            plans.pop(next(iter(plans)))
        plans[key] = plan
    return plan


@handler("partition", inline=False)
def _partition(server, msg):
    """Run this task's part of a graph. Body: ``run`` (id), ``feeds`` {node: buffer}, ``fetch``
    [node], ``soft`` (allow soft placement), ``ids`` {task: server id} (where sends go),
    ``timeout``; buffer 0: the pickled entries (cluster/partition.py): ``("feed", index, name,
    shape, dtype)``, ``("recv", index, name, source, shape, dtype, from task)`` and ``("op",
    index, op, attrs, inputs, control inputs, name, source, device, send to)``."""
    from .sendrecv import RunContext, running

    body, store = msg.body, server.store
    run = body["run"]
    ctx = RunContext(server, run, body.get("timeout", RECV_TIMEOUT), body.get("ids"))
    plan = None
    try:
        plan = _task_plan(server, msg.buffers[0], body.get("fetch", ()), body.get("soft"))
        feeds = {int(i): msg.buffers[b] for i, b in body.get("feeds", {}).items()}
        with running(ctx):
            fetched = plan.plan(*[feeds[i] for i in plan.feeds])
    finally:
        for index in plan.recvs if plan is not None else ():
            store.pop(f"{run}/{index}")
        store.pop(f"abort/{run}")
    return Reply({}, [_host(v) for v in fetched])


def owner_of(device: str) -> str:
    """The task name of a full device string."""
    job, index = parse_task(split_device(device)[0])
    return task_name(job, index)
