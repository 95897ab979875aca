"""``ParameterServerStrategy``: variables live on ``ps`` tasks, workers update them asynchronously,
and a :class:`ClusterCoordinator` in this process schedules steps on the workers.

>>> cluster = fl.cluster.LocalCluster(workers=2, ps=1)                       # doctest: +SKIP
>>> strategy = fl.distribute.ParameterServerStrategy(cluster)                # doctest: +SKIP
>>> with strategy.scope():                                                   # doctest: +SKIP
...     w = fl.Variable(...); opt = fl.optimizers.SGD(0.1)                   # placed on the ps tasks
>>> coordinator = fl.distribute.ClusterCoordinator(strategy)                 # doctest: +SKIP
>>> coordinator.schedule(step_fn, args=(batch,))                             # doctest: +SKIP
>>> coordinator.join()                                                       # doctest: +SKIP

- Variables created in ``scope()`` are spread round-robin over the ps tasks (each keeps them in
  its store, with a version number that counts its updates).
- ``schedule(fn, args)`` sends ``fn`` to the worker with the fewest steps in flight and returns a
  :class:`RemoteValue` at once. On the worker, the step first reads (pulls) the variables it uses
  from their ps tasks, then runs ``fn``; ``optimizer.apply_gradients`` inside it pushes the
  gradients to the ps tasks, which apply them with their own copy of the optimizer, one push at a
  time. Nothing waits for other workers: that is the asynchrony. A worker sends the pickled
  optimizer with its first push to each ps task only; later pushes carry just the gradients.
- Steps cannot be traced whole (``strategy.run`` inside ``@fl.function`` raises a
  NotImplementedError that says what to do instead): the pushes happen eagerly, as a step runs.
- Staleness is observable: a push records, for each variable, how many updates other workers made
  between this step's read and its push (``strategy.staleness()``): 0 with one worker, often more
  with several.
- ``coordinator.join()`` waits for every scheduled step and refreshes this process's copies of
  the variables from the ps tasks (``strategy.pull()`` does that alone).
- ``Model.fit`` of a model compiled in ``scope()`` schedules each batch's step on a worker the same
  way (``fit_coordinator()``; see ``ScheduledStep`` in flowlab/distribute/keras_fit.py), with at
  most one step per worker in flight, and pulls the weights at the end of each epoch; evaluate
  and predict run here, on the pulled weights. A metric's variables stay in this process.
- A worker that dies while it runs a step loses no step: when the step's result is fetched, the
  coordinator schedules it again on a live worker (``rescheduled`` counts these; a warning on the
  ``flowlab.distribute`` logger names the worker) and gives the dead worker nothing more until
  ``cluster.restart(i)`` brings it back, when the next ``schedule`` uses it again. ``fit`` goes on
  the same way. A step runs at least once (one that died after its push is pushed twice); a dead
  ps task is not recovered from.
"""
from __future__ import annotations

import itertools
import logging

import numpy as np

from ..core.tensor import variable_creator_scope
from .strategy import Strategy, _tls

__all__ = ["ParameterServerStrategy", "ClusterCoordinator", "RemoteValue"]

_log = logging.getLogger("flowlab.distribute")


# -- on a ps task (handlers installed by the coordinator) -------------------------------------------
class _PSState:
    def __init__(self):
        self.vars: dict = {}        # key -> fl.Variable
        self.versions: dict = {}    # key -> updates applied
        self.optimizers: dict = {}  # the coordinator's optimizer id -> this task's copy
        self.staleness: list = []   # one entry per (push, variable)
        self.pushes = 0             # pushes applied
        self.with_optimizer = 0     # pushes that carried a pickled optimizer
        self.optimizer_loads = 0    # optimizers unpickled (once per optimizer, unless forgotten)


def _ps_install():
    from ..cluster.server import current_server
    srv = current_server()
    st = srv.state(__name__, _PSState)
    srv.register("ps_create", lambda s, m: _ps_create(st, m), inline=True)
    srv.register("ps_read", lambda s, m: _ps_read(st, m), inline=True)
    srv.register("ps_push", lambda s, m: _ps_push(st, m), inline=True)
    srv.register("ps_stats", lambda s, m: {"staleness": st.staleness, "versions": st.versions, "pushes": st.pushes,
                                           "with_optimizer": st.with_optimizer,
                                           "optimizer_loads": st.optimizer_loads}, inline=True)
    return srv.name


def _ps_create(st, msg):
    from ..core.tensor import Variable
    key = msg.body["key"]
    st.vars[key] = Variable(np.array(msg.buffers[0]), name=key)
    st.versions[key] = 0


def _ps_read(st, msg):
    from ..cluster.server import Reply
    keys = msg.body["keys"]
    return Reply({"versions": [st.versions[k] for k in keys]}, [np.array(st.vars[k]._value) for k in keys])


def _ps_push(st, msg):
    """Apply one worker's gradients. The optimizer comes pickled with a worker's first push to this
    task (``with_opt``) and is kept by its key; a push without it for an optimizer this task does
    not hold applies nothing and asks for it (``need_optimizer``), and the worker sends it again."""
    from ..cluster.protocol import loads
    body = msg.body
    carried = body.get("with_opt", True)
    opt = st.optimizers.get(body["opt"])
    if opt is None:
        if not carried:
            return {"need_optimizer": True}
        opt = st.optimizers[body["opt"]] = loads(msg.buffers[0])
        st.optimizer_loads += 1
    st.pushes += 1
    st.with_optimizer += bool(carried)
    keys = body["keys"]
    grads = msg.buffers[1:] if carried else msg.buffers
    for k, read in zip(keys, body["read"]):
        st.staleness.append(st.versions[k] - read)
    opt.apply_gradients([(np.array(g), st.vars[k]) for g, k in zip(grads, keys)])
    for k in keys:
        st.versions[k] += 1
    step = st.vars.get(body["opt"])   # the optimizer's step counter, where it lives on this ps task
    if step is not None:
        step._value = np.array(opt.iterations._value, dtype=step._value.dtype).reshape(step._value.shape)


# -- on a worker: the (ps task, optimizer key) pairs whose ps task has been sent the optimizer ---------
_SENT: set = set()


# -- the strategy -----------------------------------------------------------------------------------
class ParameterServerStrategy(Strategy):
    """Asynchronous training with variables on the ``ps`` tasks of ``cluster`` (a LocalCluster
    with ``ps >= 1``); see the module docstring. On a worker, inside a scheduled step, it is the
    strategy of that one replica."""

    _no_traced_run = (
        "ParameterServerStrategy pushes each step's gradients to the ps tasks as it runs, eagerly, so its "
        "steps cannot be traced whole. Schedule a plain Python step function with ClusterCoordinator.schedule, "
        "put @fl.function on the forward pass and gradient inside it (return the gradients), and call "
        "optimizer.apply_gradients outside the traced function")

    def __init__(self, cluster_resolver, variable_partitioner=None):
        from .cluster_resolver import ClusterResolver, SimpleClusterResolver
        if isinstance(cluster_resolver, ClusterResolver) or not hasattr(cluster_resolver, "tasks"):
            raise TypeError(
                f"ParameterServerStrategy takes the cluster itself in flowlab: a fl.cluster.LocalCluster(workers=2, "
                f"ps=1) started in this process, which then acts as the coordinator (TensorFlow's 'chief'); got "
                f"{type(cluster_resolver).__name__}. ps and worker processes started by hand from TF_CONFIG are "
                f"TensorFlow 1's between-graph setup: flowlab.compat.v1 with tf.train.replica_device_setter")
        super().__init__(["/cpu:0"])
        cluster = cluster_resolver
        self._cluster_resolver = SimpleClusterResolver(cluster.spec, task_type="chief", task_id=0)
        self._cluster = cluster
        self._ps = [t for t in cluster.tasks if t.startswith("/job:ps/")]
        if not self._ps:
            raise ValueError("ParameterServerStrategy needs a cluster with ps tasks, e.g. LocalCluster(workers=2, ps=1)")
        self._workers = list(cluster.workers)
        self._handles: dict = {}          # variable id -> (ps task, key)
        self._variables: dict = {}        # variable id -> the coordinator's Variable
        self._next = itertools.count()
        for t in self._ps:
            cluster.call(t, _ps_install, timeout=60)

    @property
    def num_replicas_in_sync(self) -> int:
        return 1      # asynchronous: no replicas wait for one another

    def __getstate__(self):
        # what a worker needs: where each variable lives (not the cluster or the coordinator's copies)
        return {"_handles": self._handles, "_devices": ["/cpu:0"], "_num_local": 1, "_comm": None,
                "_num_workers": 1, "_worker": 0, "_algorithm": "ring", "_timeout": self._timeout,
                "_cluster": None, "_ps": self._ps, "_workers": self._workers, "_variables": {}}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.extended = self

    @property
    def parameter_devices(self) -> tuple:
        return tuple(self._ps)

    @property
    def worker_tasks(self) -> tuple:
        """The worker tasks that run scheduled steps."""
        return tuple(self._workers)

    def fit_step(self, model, kind: str, specs):
        """``Model.fit`` schedules each train step on a worker (:class:`.keras_fit.ScheduledStep`);
        evaluate runs the model's own step here."""
        if kind != "train":
            return None
        from .keras_fit import ScheduledStep
        return ScheduledStep(model, self, len(specs))

    def fit_coordinator(self) -> "ClusterCoordinator":
        """The coordinator ``Model.fit`` schedules its steps with (one per strategy)."""
        coordinator = getattr(self, "_fit_coordinator", None)
        if coordinator is None:
            coordinator = self._fit_coordinator = ClusterCoordinator(self)
        return coordinator

    def scope(self):
        return _PSScope(self)

    def _on_variable_created(self, v):
        task = self._ps[next(self._next) % len(self._ps)]
        key = f"var{v._id}"
        self._cluster.client.request(task, "ps_create", {"key": key}, [np.array(v._value, order="C")], timeout=60)
        self._handles[v._id] = (task, key)
        self._variables[v._id] = v

    def placement(self, variable) -> str:
        """The ps task that holds ``variable``."""
        return self._handles[variable._id][0]

    # -- on a worker ----------------------------------------------------------------------------
    def _peers(self):
        from ..cluster.server import current_server
        srv = current_server()
        peers = srv.peers()
        for t in self._ps:
            if t not in peers:
                peers.add(t, srv.spec.address_of(t))
        return peers

    def _pull_on_worker(self, variables, handles):
        """Refresh ``variables`` (unpickled copies: known here by identity, ``handles[i]`` says
        where ``variables[i]`` lives) from their ps tasks; remember the versions read."""
        peers = self._peers()
        self._local = {id(v): h for v, h in zip(variables, handles)}
        by_task: dict = {}
        for v, (task, key) in zip(variables, handles):
            by_task.setdefault(task, []).append((v, key))
        read = {}
        for task, items in by_task.items():
            reply = peers.request(task, "ps_read", {"keys": [k for _, k in items]}, timeout=self._timeout)
            for (v, key), arr, ver in zip(items, reply.buffers, reply.body["versions"]):
                v._value = np.array(arr)
                read[id(v)] = ver
        self._read = read

    def _apply_in_replica(self, ctx, optimizer, apply, grads_and_vars):
        from ..cluster.protocol import dumps
        from ..core.tensor import convert_to_tensor
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        local = getattr(self, "_local", {})
        unknown = [v.name for _, v in pairs if id(v) not in local]
        if unknown:
            raise ValueError(f"variables {unknown} were not created in ParameterServerStrategy.scope(), so no "
                             f"ps task holds them")
        peers = self._peers()
        by_task: dict = {}
        for g, v in pairs:
            task, key = local[id(v)]
            by_task.setdefault(task, []).append((np.array(convert_to_tensor(g)._value, order="C"), v, key))
        # the optimizer's name on the ps tasks: its step counter's place when it was made in scope()
        # (the same on every worker and step), else its settings
        held = local.get(id(optimizer.iterations))
        opt_key = held[1] if held else f"{type(optimizer).__name__}{sorted(optimizer.get_config().items())}"
        code = []        # the pickled optimizer, made only if some ps task needs it

        def push(task, items, with_opt):
            if with_opt and not code:
                code.append(dumps(optimizer))
            body = {"opt": opt_key, "keys": [k for _, _, k in items], "with_opt": with_opt,
                    "read": [self._read.get(id(v), 0) for _, v, _ in items]}
            return peers.submit(task, "ps_push", body, [*code[:with_opt], *[g for g, _, _ in items]])

        tasks = list(by_task)
        replies = peers.results([push(t, by_task[t], (t, opt_key) not in _SENT) for t in tasks], self._timeout)
        again = [t for t, r in zip(tasks, replies) if isinstance(r.body, dict) and r.body.get("need_optimizer")]
        if again:        # a ps task that does not hold this optimizer (any more): send it with the gradients
            peers.results([push(t, by_task[t], True) for t in again], self._timeout)
        _SENT.update((t, opt_key) for t in tasks)
        return optimizer.iterations

    # -- on the coordinator ------------------------------------------------------------------------
    def pull(self) -> None:
        """Give this process's variables the values they have on the ps tasks now."""
        client = self._cluster.client
        for vid, (task, key) in self._handles.items():
            reply = client.request(task, "ps_read", {"keys": [key]}, timeout=60)
            self._variables[vid]._value = np.array(reply.buffers[0])

    def staleness(self) -> list:
        """Per pushed variable update, in order per ps task: how many updates it missed."""
        out = []
        for t in self._ps:
            out += self._cluster.client.request(t, "ps_stats", timeout=60).body["staleness"]
        return out


class _PSScope:
    def __init__(self, strategy):
        self.strategy = strategy

    def __enter__(self):
        _tls.__dict__.setdefault("strategies", []).append(self.strategy)
        self._creators = variable_creator_scope(self.strategy._on_variable_created)
        self._creators.__enter__()
        return self.strategy

    def __exit__(self, *exc):
        _tls.strategies.pop()
        self._creators.__exit__(None, None, None)
        return False


def _worker_step(strategy, fn, args, kwargs, variables, handles):
    """What a scheduled step runs on a worker: pull, then ``fn`` in replica context."""
    strategy._pull_on_worker(variables, handles)
    result = strategy.run(fn, args, kwargs)
    return _numpy(result)


def _numpy(value):
    from ..core.tensor import Tensor
    from .values import map_structure
    return map_structure(lambda v: v.numpy() if isinstance(v, Tensor) else v, value)


class RemoteValue:
    """The result of a scheduled step, once it has run: ``fetch()`` waits for it."""

    def __init__(self, coordinator, payload):
        self._coordinator, self._payload = coordinator, payload
        self._pending, self._value, self._done = None, None, False

    def fetch(self, timeout: float | None = None):
        if not self._done:
            self._value = self._coordinator._collect(self, timeout)
            self._done = True
            self._payload = None
        return self._value


class ClusterCoordinator:
    """Schedules steps on the workers of a ParameterServerStrategy's cluster.

    A worker that dies (or stops answering) while it runs a step does not stop training: the
    step is scheduled again on a surviving worker when its result is fetched (``rescheduled``
    counts these), and the dead worker gets no new steps until it is alive again
    (``cluster.restart(i)``), when it is picked up by the next ``schedule``. A step runs at least
    once: one that died after pushing its gradients is pushed again by its second run."""

    def __init__(self, strategy: ParameterServerStrategy):
        self.strategy = strategy
        self._inflight = {w: [] for w in strategy._workers}
        self._lost: set = set()       # workers that died under a step; given work again once alive
        self.rescheduled = 0          # steps run again because their worker was lost

    def schedule(self, fn, args=(), kwargs=None) -> RemoteValue:
        """Run ``fn(*args, **kwargs)`` on the least busy live worker, asynchronously."""
        from ..cluster.protocol import dumps
        s = self.strategy
        ids = list(s._variables)
        variables, handles = [s._variables[i] for i in ids], [list(s._handles[i]) for i in ids]
        # one pickle for fn and the variables: the copies fn uses on the worker are those in the list
        payload = dumps(((s, fn, tuple(args), kwargs or {}, variables, handles), {}))
        value = RemoteValue(self, payload)
        self._submit(value)
        return value

    def _live(self):
        if self._lost:                # back in the pool once restarted
            cluster = self.strategy._cluster
            self._lost = {w for w in self._lost if cluster.status(w) != "alive"}
        return [w for w in self._inflight if w not in self._lost]

    def _submit(self, value):
        from ..cluster.errors import WorkerDiedError, WorkerUnresponsiveError
        from ..cluster.protocol import dumps
        client = self.strategy._cluster.client
        while True:
            live = self._live()
            if not live:
                raise RuntimeError(
                    f"ClusterCoordinator: no worker is alive to run a step (lost: {', '.join(sorted(self._lost))}); "
                    f"start one again with cluster.restart(i), then schedule again")
            worker = min(live, key=lambda w: len(self._inflight[w]))
            try:
                value._pending = client.submit(worker, "run", None, [dumps(_worker_step), value._payload])
            except (WorkerDiedError, WorkerUnresponsiveError):
                self._lost.add(worker)
                continue
            self._inflight[worker].append(value)
            return

    def _collect(self, value, timeout):
        from ..cluster.errors import WorkerDiedError, WorkerUnresponsiveError
        from ..cluster.protocol import loads
        client = self.strategy._cluster.client
        while True:
            task = value._pending.task
            try:
                msg = client.results([value._pending], timeout)[0]
            except (WorkerDiedError, WorkerUnresponsiveError) as err:
                self._forget(task, value)
                if err.task not in (None, task):
                    raise
                self._lost.add(task)
                self.rescheduled += 1
                _log.warning("ClusterCoordinator: %s; its step runs again on another worker", str(err).splitlines()[0])
                self._submit(value)
                continue
            except BaseException:
                self._forget(task, value)
                raise
            self._forget(task, value)
            return loads(msg.buffers[0])

    def _forget(self, task, value):
        if value in self._inflight[task]:
            self._inflight[task].remove(value)

    def join(self, timeout: float | None = None) -> None:
        """Wait for every scheduled step (raising the first error), then pull the variables."""
        while not self.done():
            for values in list(self._inflight.values()):
                for v in list(values):
                    v.fetch(timeout)
        self.strategy.pull()

    def done(self) -> bool:
        return not any(self._inflight.values())
