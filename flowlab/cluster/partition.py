"""Graphs across tasks: split a graph by task, turn cross-task edges into send/recv pairs, run.

``Session(target)`` (``flowlab.compat.v1``) asks :func:`connect` for the cluster behind a target
and ``plan(graph, fetches, feeds)`` for a :class:`PartitionedPlan`. Planning:

1. the nodes the fetches need, as a local session would run them (no graph passes: a node keeps
   the device its author gave it);
2. each node's task: its ``fl.device`` job and task; fields left out come from the master (the
   task the session's target names), as in TensorFlow, so unplaced nodes run on the master; a
   node that reads or updates a variable placed on a task runs on that task;
3. per task, its nodes in graph order: the graph pass that splits the graph. An edge from a node
   on task A to a node on task B becomes a ``send`` node on A after the producer and a ``recv``
   node on B before its first reader (table ops, cluster/sendrecv.py): A posts the value to B once
   it is computed (B stores it on arrival; no client in between). A fed value travels from the
   client to each task that reads it. Variables travel as references: each task keeps the
   variables its nodes read and assign, so a variable placed on a ps task lives there.

Running sends every task its partition at once; each task makes it a core Graph and runs it with
core's executor (``compile_plan``, compiled once per partition: cluster/task_exec.py), so sessions,
traced functions and partitions share one graph runner. They run concurrently and each returns
the fetched values it computed. If one task fails the others are told to stop waiting, and the error names the
node, its op, the line that made it and the task. Partitions travel as data: op names from the op
table, attributes and input indices, pickled only inside signed messages.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.dtypes import numpy_dtype
from ..core.errors import InvalidArgumentError, did_you_mean
from .errors import ClusterError, ClusterTimeoutError, RemoteError
from .protocol import dumps, new_id
from .spec import ClusterSpec, parse_task, task_name
from .task_exec import SHARED, VarRef, split_device

__all__ = ["connect", "Connection", "PartitionedPlan", "StagedPlan", "task_of"]

_VAR_PREFIX = f"{os.getpid()}-{os.urandom(3).hex()}"
RUN_TIMEOUT = 300.0      # seconds a run may take when no liveness monitor watches the tasks


class NoClusterError(ClusterError, NotImplementedError):
    """A session target with no cluster behind it that this process can reach (a NotImplementedError
    too, as core's RemoteDeviceError is: running elsewhere needs a cluster)."""


def _normalise_target(target: str) -> str:
    for scheme in ("flowlab://", "grpc://"):
        if target.startswith(scheme):
            address = target[len(scheme):]
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                break
            return f"{'127.0.0.1' if host == 'localhost' else host}:{port}"
    raise ValueError(f"Session target {target!r} is not a cluster address: use cluster.target "
                     f"(flowlab://127.0.0.1:PORT) or the TensorFlow spelling grpc://HOST:PORT")


class Connection:
    """A client to every task of a cluster, and which task is the master (the target's)."""

    def __init__(self, client, spec: ClusterSpec, master: str, owned: bool, monitored: bool, pending=None,
                 tasks=None):
        self.client, self.spec, self.master, self.owned = client, spec, master, owned
        self.timeout = None if monitored else RUN_TIMEOUT
        self.tasks = tasks if tasks is not None else set(spec.tasks())   # a set its owner may grow
        self._pending = dict(pending or {})   # task -> address: not connected to until a graph needs it
        self.closed = False

    def ensure(self, tasks, timeout: float = 10.0) -> None:
        """Connect to those of ``tasks`` not reached yet (a graph's tasks, when it is first planned):
        a worker's session needs only the tasks its graph uses, not every worker of the cluster."""
        for task in tasks:
            address = self._pending.get(task)
            if address is None:
                continue
            try:
                self.client.add(task, address, timeout=timeout)
            except ClusterTimeoutError:
                raise ClusterError(f"no flowlab server answered for {task} at {address} within {timeout:g} s, and "
                                   f"this graph has nodes there: start that task's server first") from None
            del self._pending[task]

    def close(self):
        self.closed = True
        if self.owned:
            self.client.close()

    def plan(self, graph, fetches, feeds, soft: bool = False, placement=None, also=()) -> "PartitionedPlan":
        return PartitionedPlan(self, graph, fetches, feeds, soft, placement, also)


def connect(target: str, timeout: float = 10.0) -> Connection:
    """The cluster behind a session target: a LocalCluster of this process with that target, or
    else the tasks found by asking the server at that address (key from ``FLOWLAB_CLUSTER_KEY``)."""
    from .local import cluster_for_target

    address = _normalise_target(target)
    cluster = cluster_for_target(f"flowlab://{address}")
    if cluster is not None and not cluster.closed:
        return Connection(cluster.client, cluster.spec, cluster.tasks[0], owned=False, monitored=True)
    from .client import Client
    from .server import key_from_env

    key = key_from_env()
    if key is None:
        raise NoClusterError(f"Session({target!r}): no LocalCluster of this process has that target, and no cluster "
                           f"key is set to reach one started elsewhere (set FLOWLAB_CLUSTER_KEY, the hex key its "
                           f"servers were started with, or use the target of a running LocalCluster)")
    client = Client(key, name="session")
    try:
        probe = "/job:_target/task:0"
        try:
            client.add(probe, address, timeout=timeout)
        except ClusterTimeoutError:
            raise ClusterError(f"Session({target!r}): no flowlab server answered at {address} within {timeout:g} s; "
                               f"start the cluster's servers first (tf.train.Server(cluster, job_name=..., "
                               f"task_index=...) in each process)") from None
        hello = client.request(probe, "hello", timeout=timeout).body
        cluster = client.request(probe, "cluster", timeout=timeout).body.get("cluster")
        client.remove(probe)
        if not cluster:
            spec = ClusterSpec({parse_task(hello["task"])[0]: {parse_task(hello["task"])[1]: address}})
        else:
            spec = ClusterSpec({j: ({int(i): a for i, a in t.items()} if isinstance(t, dict) else t)
                                for j, t in cluster.items()})
        client.add(hello["task"], address, timeout=timeout)
        pending = {t: spec.address_of(t) for t in spec.tasks() if t != hello["task"]}
    except BaseException:
        client.close()
        raise
    return Connection(client, spec, hello["task"], owned=True, monitored=False, pending=pending)


def task_of(node, master: str) -> tuple[str, str]:
    """(task, device on that task) for a node: its device's job and task, the master's where unset.
    A node that reads or updates a variable placed on a task runs there (it is colocated with the
    variable, whatever scope it was made in), as in TensorFlow."""
    spec = node.device
    variable = node.attrs.get("variable") if node.attrs else None
    if variable is not None and isinstance(getattr(variable, "_device", None), str) \
            and not variable._device.startswith("/job:localhost/"):
        from ..core.device import as_spec
        spec = as_spec(variable._device)
    mjob, mindex = parse_task(master)
    if not spec:
        return master, "/device:CPU:0"
    job = spec.job if spec.job not in (None, "localhost") else mjob
    index = spec.task if spec.task is not None else (mindex if job == mjob else 0)
    dev = f"/device:{spec.device_type or 'CPU'}:{spec.device_index or 0}"
    return task_name(job, index), dev


def _spec(node):
    """(shape, dtype) of a node's output as they travel: shape a tuple (None dims) or None."""
    shape = node.output.shape
    return (None if shape.rank is None else tuple(shape), numpy_dtype(node.output.dtype).str)


def _wire_attrs(attrs):
    """Attributes as they travel: variables become references (each task keeps its own). A variable
    with a ``shared_name`` (a TF1 variable placed on a task) is that task's resource of that name,
    the same for every client that names it (task_exec.SHARED)."""
    if not attrs:
        return {}
    out = dict(attrs)
    for k, v in attrs.items():
        if k == "variable" and hasattr(v, "_id"):
            shared = getattr(v, "shared_name", None)
            uid = f"{SHARED}{shared}" if shared else f"{_VAR_PREFIX}-{v._id}"
            out[k] = VarRef(uid, getattr(v, "_name", "Variable"), v._value.shape, v._value.dtype)
    return out


class PartitionedPlan:
    """The per-task partitions that compute ``fetches`` from ``feeds``; call it with the fed arrays.
    ``nodes``: the graph nodes it runs; ``partitions``: {task: [node names]} (for display).
    ``placement``: {node index: (task, device)}, where given (else :func:`task_of`); ``also``: nodes
    to run for their effects though no fetch needs them."""

    def __init__(self, conn: Connection, graph, fetches, feeds, soft=False, placement=None, also=()):
        self.conn, self.graph, self.soft = conn, graph, soft
        self.fetches, self.feeds = list(fetches), list(feeds)
        fed = {id(t.node): i for i, t in enumerate(self.feeds)}
        self.nodes = graph.nodes_for(self.fetches, self.feeds, also=also)
        where, entries, feeds_of, recvs = {}, {}, {}, set()
        self._position = {}       # node index -> its place in its task's partition
        for n in self.nodes:
            task, dev = placement[n.index] if placement is not None else task_of(n, conn.master)
            if task not in conn.tasks:
                raise InvalidArgumentError(
                    f"node {n.name} (made at {n.source}) is placed on {task}, which this cluster does not have "
                    f"(it has {sorted(conn.tasks)}){did_you_mean(task, sorted(conn.tasks))} The job names and task "
                    f"numbers in fl.device / tf.device strings must match the ClusterSpec's", op=n.op.name, source=n.source)
            where[n.index] = task
            part = entries.setdefault(task, [])
            # the graph pass: an edge from another task becomes a recv here and a send there (a
            # control input too: the value is not used, but the node waits for it)
            controls = [c.index for c in getattr(n, "control_inputs", ()) or ()]
            for src in [t.node for t in n.inputs] + list(getattr(n, "control_inputs", ()) or ()):
                if id(src) in fed:
                    if src.index not in feeds_of.setdefault(task, {}):
                        feeds_of[task][src.index] = fed[id(src)]
                        part.append(("feed", src.index, src.name) + _spec(src))
                elif where[src.index] != task and (src.index, task) not in recvs:
                    recvs.add((src.index, task))
                    owner = where[src.index]
                    entries[owner][self._position[src.index]][9].append(task)
                    part.append(("recv", src.index, src.name, src.source) + _spec(src) + (owner,))
            self._position[n.index] = len(part)
            part.append(("op", n.index, n.op.name, _wire_attrs(n.attrs), [t.node.index for t in n.inputs], controls,
                         n.name, n.source, dev, []))
        # what each task returns: the fetches it computes (a fed fetch comes from the client)
        self._fetch_from = []
        fetch_of: dict[str, list] = {}
        for t in self.fetches:
            if id(t.node) in fed:
                self._fetch_from.append(("feed", fed[id(t.node)]))
                continue
            task = where[t.node.index]
            lst = fetch_of.setdefault(task, [])
            if t.node.index not in lst:
                lst.append(t.node.index)
            self._fetch_from.append((task, lst.index(t.node.index)))
        self.partitions = {task: [e[6] if e[0] == "op" else f"recv {e[2]} from {e[6]}" for e in part
                                  if e[0] != "feed"] for task, part in entries.items()}
        conn.ensure(entries)
        ids = {task: conn.client.server_id(task) for task in entries}   # a task sends only to these servers
        self._messages = {task: (dumps(part), feeds_of.get(task, {}), fetch_of.get(task, []),
                                 {to: ids[to] for e in part if e[0] == "op" for to in e[9] if ids.get(to)})
                          for task, part in entries.items()}

    def __call__(self, *arrays):
        client, run = self.conn.client, new_id("run")
        tasks = list(self._messages)
        pendings = []
        for task in tasks:
            nodes, feeds, fetch, ids = self._messages[task]
            bufs = [nodes]
            body_feeds = {}
            for index, i in feeds.items():
                body_feeds[str(index)] = len(bufs)
                bufs.append(np.asarray(arrays[i]))    # the transport makes it contiguous (0-d stays 0-d)
            body = {"run": run, "feeds": body_feeds, "fetch": fetch, "soft": self.soft, "ids": ids}
            pendings.append(client.submit(task, "partition", body, bufs))
        try:
            replies = client.results(pendings, self.conn.timeout)
        except BaseException as e:
            for task in tasks:   # let the others stop waiting for values that will not come
                try:
                    client.submit(task, "abort", {"run": run, "why": f"{type(e).__name__} elsewhere"})
                except Exception:  # noqa: BLE001 - a dead task cannot be told
                    pass
            if isinstance(e, RemoteError):
                raise InvalidArgumentError(e.remote_message) from None
            raise
        got = dict(zip(tasks, replies))
        out = []
        for src, i in self._fetch_from:
            out.append(arrays[i] if src == "feed" else got[src].buffers[i])
        return tuple(out)

    def pretty(self) -> str:
        """Each task's partition: its nodes in order, with the receives from other tasks."""
        lines = []
        for task, names in self.partitions.items():
            lines.append(f"{task}:")
            lines.extend(f"    {n}" for n in names)
        return "\n".join(lines)

    def __repr__(self):
        return self.pretty()


class StagedPlan:
    """A traced function's plan when some of its nodes are placed on a cluster's tasks (``@fl.function``
    with ``fl.device("/job:worker/task:1")`` inside; core hands it over through
    ``set_graph_partitioner``). The nodes run in stages, alternately here and on the tasks: a node
    runs in the first stage of its side that comes after every stage it depends on (and, if it is
    stateful, after the previous stateful node's, so side effects keep program order). A local stage
    is core's compiled plan (``compile_plan``: the graph passes, generated code); a remote stage is a
    :class:`PartitionedPlan`, the runner a cluster ``Session`` uses: every task runs its part at once,
    with send/recv pairs between them. Values crossing stages come back here and are fed onwards. A
    node that reads or updates a variable runs here, where the variable's value is. Usually that is
    three stages (inputs here, the remote work, outputs here), and often just one remote stage.

    ``connect(tasks)`` gives the :class:`Connection` of an open cluster that has ``tasks``; the
    remote stages are planned on it on first call, and again if that cluster was closed."""

    def __init__(self, graph, fetches, feeds, elsewhere, connect):
        from ..core.executor import compile_plan

        self.graph, self.fetches, self.feeds, self._connect = graph, list(fetches), list(feeds), connect
        self.placement = {}
        for index, device in elsewhere.items():
            task, dev = split_device(device)
            self.placement[index] = (task_name(*parse_task(task)), dev)
        stateful = [n for n in graph.nodes if n.op.stateful]
        nodes = graph.nodes_for(self.fetches, self.feeds, also=stateful)
        stage, last_effect = {}, 0
        for n in nodes:   # program order: every input's stage is known
            s = max([stage.get(src.index, 0) for src in [t.node for t in n.inputs] + list(n.control_inputs)],
                    default=0)
            if n.op.stateful:
                s = max(s, last_effect)
            if (s % 2 == 1) != (n.index in self.placement):   # odd stages run on the cluster, even ones here
                s += 1
            if n.op.stateful:
                last_effect = s
            stage[n.index] = s
        wanted = {t.node.index for t in self.fetches}
        for n in nodes:   # a value a later stage reads is fetched by its own stage
            for src in [t.node for t in n.inputs] + list(n.control_inputs):
                if src.index in stage and stage[src.index] != stage[n.index]:
                    wanted.add(src.index)
        self.stages = []     # [(remote?, fed tensors, fetched tensors, effect nodes, plan or None)]
        for k in sorted(set(stage.values())):
            members = [n for n in nodes if stage[n.index] == k]
            inside = {n.index for n in members}
            feeds_in, seen = [], set()
            for n in members:
                for src in [t.node for t in n.inputs] + list(n.control_inputs):
                    if src.index not in inside and src.index not in seen:
                        seen.add(src.index)
                        feeds_in.append(src.output)
            outs = [n.output for n in members if n.index in wanted]
            effects = [n for n in members if n.op.stateful and n.index not in wanted]
            if k % 2:
                self.stages.append((True, feeds_in, outs, effects, None))
            else:   # here: core's runner, its effects fetched so that it runs them
                plan = compile_plan(graph, outs + [n.output for n in effects], feeds_in, run_stateful=False)
                self.stages.append((False, feeds_in, outs, effects, plan))
        self._conn = None
        self._remote_plans: list = []

    def _bind(self):
        conn = self._connect({task for task, _ in self.placement.values()})
        plans = [conn.plan(self.graph, outs, feeds_in, placement=self.placement, also=effects)
                 for remote, feeds_in, outs, effects, _ in self.stages if remote]
        self._conn, self._remote_plans = conn, plans

    def __call__(self, *arrays):
        if self._conn is None or self._conn.closed:
            self._bind()
        env = {t.node.index: a for t, a in zip(self.feeds, arrays)}
        remote_plans = iter(self._remote_plans)
        for remote, feeds_in, outs, _, plan in self.stages:
            results = (next(remote_plans) if remote else plan)(*[env[t.node.index] for t in feeds_in])
            for t, value in zip(outs, results):
                env[t.node.index] = value
        return tuple(env[t.node.index] for t in self.fetches)

    def pretty(self) -> str:
        """The stages in order: each remote one as its tasks' partitions, each local one as its nodes."""
        lines, remote_plans = [], iter(self._remote_plans)
        for k, (remote, _, outs, effects, plan) in enumerate(self.stages):
            lines.append(f"stage {k}: " + ("on the cluster" if remote else "here"))
            part = next(remote_plans, None) if remote else None
            body = part.pretty() if part is not None else "\n".join(n.name for n in plan.traced_nodes) if plan else ""
            lines.extend("    " + line for line in body.splitlines())
        return "\n".join(lines)
