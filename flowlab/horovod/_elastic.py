"""Elastic Horovod's in-memory commit, over flowlab's fixed ranks: ``hvd.elastic.run``, the state
classes and the per-process store of each state's last commit.

Horovod elastic keeps a training state in memory (``state.commit()``), and when a collective
fails because a peer went away it restores that state, lets the ranks agree on a new group, and
runs the training function again, after a sync that gives every rank rank 0's state. flowlab's
ranks do not change while training runs, so the retry works differently: ``fl.distribute.run_with_recovery``
restarts the lost worker in place and runs the training function again on every worker. What
survives between the two tries is the process of each worker that was not lost, and in it this
module's store: the last commit of every state, keyed by the state's name. At the start of each
try (``elastic.run``) the ranks allgather their commit counters, the rank holding the newest
commit (lowest rank on a tie) restores it and broadcasts it, and every rank continues from it.
Unlike Horovod's sync from rank 0, this also holds when rank 0 is the worker that was lost.

A commit lives until the decorated function returns, or raises an error that a lost peer did not
cause (then the next run starts afresh). A collective error or an interrupt (the cancel a
cluster sends to survivors of a lost worker) keeps it: that is the case a retry resumes from.
"""
from __future__ import annotations

import copy
import functools
import pickle
from typing import NamedTuple

import numpy as np

__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]


class _Commit(NamedTuple):
    count: int           # how many commits this state has had (0: the state as first made)
    snapshot: dict       # {"attrs": {...}, "variables": [arrays], "optimizer": {...} or None}


_commits: dict = {}      # (state name, rank) -> _Commit: what survives in this process between two tries


def _forget(key) -> None:
    _commits.pop(key, None)


def _comm():
    """The group elastic states sync over: hvd.init()'s, else the current communicator."""
    from ..distribute import horovod
    if horovod.is_initialized():
        return horovod.process_group()
    from ..cluster.collectives import current
    return current()


class State:
    """What ``hvd.elastic.run`` keeps across a lost worker: named attributes (``**kwargs``) and, in
    the subclasses, variables and an optimizer's state. ``commit()`` keeps a copy in this process;
    ``restore()`` puts the last copy back; ``sync()`` gives every rank the newest commit any rank
    holds. Attributes are read and written as ``state.<name>`` (``state.epoch = 3``)."""

    def __init__(self, **kwargs):
        self._attr_names = tuple(kwargs)
        self._reset_callbacks: list = []
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._name = self._make_name()
        self._key = (self._name, _comm().rank)   # (the rank: threads of a LocalGroup share a process)
        self._resumed = self._key in _commits
        if not self._resumed:                 # first made in this process: the first commit is now
            _commits[self._key] = _Commit(0, self._snapshot())

    # -- what a subclass adds -------------------------------------------------------------------
    def _variables(self) -> list:
        return []

    def _optimizer(self):
        return None

    def _make_name(self) -> str:
        shapes = ",".join("x".join(map(str, v.shape)) for v in self._variables())
        return f"{type(self).__name__}({', '.join(sorted(self._attr_names))}; [{shapes}])"

    # -- the in-memory copy ----------------------------------------------------------------------
    def _snapshot(self) -> dict:
        attrs = {}
        for key in self._attr_names:
            value = getattr(self, key)
            try:
                attrs[key] = copy.deepcopy(value)
            except Exception:                 # (something that cannot be copied is kept as it is)
                attrs[key] = value
        return {"attrs": attrs, "variables": [np.array(v.numpy(), copy=True) for v in self._variables()],
                "optimizer": _optimizer_state(self._optimizer(), self._variables())}

    def _load(self, snapshot) -> None:
        variables = self._variables()
        saved = snapshot["variables"]
        if len(saved) != len(variables):
            raise ValueError(f"hvd.elastic: {self._name}: the commit holds {len(saved)} variables, the state has "
                             f"{len(variables)} now; build the model (call it once, or give it an Input) before "
                             f"making the state, and make it the same way on every worker")
        for v, value in zip(variables, saved):
            v.assign(np.array(value, copy=True))   # (the commit's arrays are never the live ones)
        _load_optimizer(self._optimizer(), variables, snapshot["optimizer"])
        for key, value in snapshot["attrs"].items():
            setattr(self, key, copy.deepcopy(value))

    @property
    def commits(self) -> int:
        """How many times this state was committed (on the rank whose commit every rank now holds)."""
        entry = _commits.get(self._key)
        return entry.count if entry is not None else 0

    def save(self) -> None:
        """Keep a copy of the state in this process (the commit a retry resumes from)."""
        before = _commits.get(self._key)
        _commits[self._key] = _Commit((before.count if before else 0) + 1, self._snapshot())  # one swap

    def commit(self) -> None:
        """``save()``, then ``check_host_updates()``: call it after each step (or every k steps)."""
        self.save()
        self.check_host_updates()

    def restore(self) -> None:
        """Put the last commit back into the attributes, variables and optimizer."""
        entry = _commits.get(self._key)
        if entry is not None:
            self._load(entry.snapshot)

    def check_host_updates(self) -> None:
        """Nothing to do in flowlab: its ranks do not change while training runs (a lost one is
        restarted in place by ``fl.distribute.run_with_recovery``; ``cluster.add_worker()`` grows a
        cluster between runs), so no host joins or leaves during a try."""
        return None

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions (no arguments) to call when a try resumes after a lost worker, after the sync."""
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"register_reset_callbacks: expected functions, got {type(cb).__name__} ({cb!r})")
        self._reset_callbacks.extend(callbacks)

    def reset(self) -> None:
        """Called before the reset callbacks; nothing to rebuild in flowlab (the group keeps its size)."""
        return None

    def on_reset(self) -> None:
        self.reset()
        for cb in self._reset_callbacks:
            cb()

    def sync(self) -> bool:
        """Give every rank the newest commit any rank holds: an allgather of the commit counters,
        then a broadcast from the rank with the highest (the lowest such rank on a tie). Returns
        True when some rank resumed a commit left by an earlier try (a worker was lost)."""
        comm = _comm()
        entry = _commits.get(self._key) or _Commit(0, self._snapshot())
        resumed, self._resumed = self._resumed, False
        if comm.size == 1:
            self._load(entry.snapshot)
            return resumed
        from ..cluster.collectives import allgather, broadcast
        table = np.asarray(allgather(np.array([[entry.count, int(resumed)]], np.int64), comm=comm))
        counts = table[:, 0]
        root = int(np.argmax(counts))            # argmax: the first (lowest) rank with the newest commit
        payload, size, failure = None, np.zeros(1, np.int64), None
        if comm.rank == root:
            try:
                payload = np.frombuffer(pickle.dumps(entry.snapshot, protocol=5), np.uint8)
                size[0] = payload.size
            except Exception as e:            # (tell the other ranks, rather than leave them waiting)
                failure, size[0] = e, -1
        size = int(np.asarray(broadcast(size, root=root, comm=comm))[0])
        if size < 0:
            raise TypeError(f"hvd.elastic: {self._name}: rank {root} could not send its commit to the other ranks: "
                            f"every value of an elastic state must pickle ({failure or 'see rank ' + str(root)})")
        if payload is None:
            payload = np.zeros(size, np.uint8)
        data = np.asarray(broadcast(payload, root=root, comm=comm))
        snapshot = entry.snapshot if comm.rank == root else pickle.loads(data.tobytes())
        self._load(snapshot)
        _commits[self._key] = _Commit(int(counts[root]), snapshot)
        return bool(table[:, 1].any())

    def __repr__(self):
        attrs = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._attr_names)
        return f"<hvd.elastic.{type(self).__name__} {attrs} commits={self.commits}>"


class ObjectState(State):
    """Python values kept across a lost worker: ``ObjectState(epoch=0, batch=0)``; read and set
    them as ``state.epoch``. Values must pickle (the sync sends them)."""


class TensorFlowKerasState(State):
    """A Keras model's variables, its optimizer's state (``optimizer``, else the model's compiled
    one: step count, learning rate, slots) and named values: ``TensorFlowKerasState(model,
    optimizer, epoch=0, batch=0)``. Build the model before (call it once, or give it an Input)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        variables = getattr(model, "variables", None)
        if variables is None:
            raise TypeError(f"hvd.elastic.TensorFlowKerasState: expected a Keras model, got {type(model).__name__}")
        if not list(variables):
            raise ValueError("hvd.elastic.TensorFlowKerasState: the model has no variables yet; build it first "
                             "(call it on a batch, or start it with fl.keras.Input(shape=...))")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def _variables(self):
        return list(self.model.variables)

    def _optimizer(self):
        return self.optimizer


class TensorFlowState(State):
    """A list of variables and named values: ``TensorFlowState(model_variables + [step], epoch=0)``
    (Horovod's TF1 form reads every global variable when ``variables`` is left out; flowlab needs
    them named). ``session`` is accepted and unused."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            raise TypeError("hvd.elastic.TensorFlowState: pass variables= (a list of fl.Variable, e.g. "
                            "model.variables); flowlab has no global variable collection to read them from")
        from ..core.tensor import Variable
        variables = list(variables)
        for v in variables:
            if not isinstance(v, Variable):
                raise TypeError(f"hvd.elastic.TensorFlowState: expected variables, got {type(v).__name__} ({v!r})")
        self.variables = variables
        super().__init__(**kwargs)

    def _variables(self):
        return self.variables


# -- an optimizer's state, positionally (the objects change from one try to the next) ------------
def _optimizer_state(opt, variables):
    if opt is None or not hasattr(opt, "iterations"):
        return None
    index = {id(v): i for i, v in enumerate(variables)}
    slots = [(index[id(var)], name, np.array(value, copy=True))
             for var, name, value in opt._slot_items() if id(var) in index]
    lr = getattr(opt, "_lr_variable", None)
    keep_lr = lr is not None and getattr(opt, "_schedule", None) is None
    return {"iterations": int(opt.iterations.numpy()), "lr": float(lr.numpy()) if keep_lr else None,
            "slots": slots}


def _load_optimizer(opt, variables, saved):
    if opt is None or saved is None or not hasattr(opt, "iterations"):
        return
    opt.iterations.assign(saved["iterations"])
    if saved["lr"] is not None and getattr(opt, "_schedule", None) is None:
        opt.learning_rate = saved["lr"]
    opt._slots.clear()                       # slots made after the commit must go too
    opt._slot_vars.clear()
    for i, name, value in saved["slots"]:
        opt._restore_slot(variables[i], name, value)


# -- the retry wrapper -----------------------------------------------------------------------------
def _lost_peer(err) -> bool:
    """Was ``err`` caused by a lost peer (a collective error), or the cancel a cluster sends to the
    survivors of a lost worker? Looks along the cause chain."""
    from ..cluster.collectives.errors import CollectiveError, NativeUnavailableError
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, KeyboardInterrupt) or (isinstance(err, CollectiveError)
                                                  and not isinstance(err, NativeUnavailableError)):
            return True
        err = err.__cause__ or err.__context__
    return False


def run(func):
    """Decorate a training function ``func(state, *args, **kwargs)`` so that it resumes from the
    newest commit of ``state`` any rank holds: every rank syncs first, then ``func`` runs. When a
    collective fails because a peer was lost, the state goes back to its last commit and the error
    is raised, so that ``fl.distribute.run_with_recovery`` restarts the lost worker and runs the
    training again; the next try's sync brings the restarted worker up to the newest commit.

    >>> import flowlab.horovod as hvd
    >>> def train():                                              # doctest: +SKIP
    ...     hvd.init()
    ...     model, opt = make_model(), fl.optimizers.SGD(0.1)
    ...     state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
    ...
    ...     @hvd.elastic.run
    ...     def loop(state):
    ...         for state.epoch in range(state.epoch, EPOCHS):
    ...             for state.batch in range(state.batch, BATCHES):
    ...                 step(model, opt, state.epoch, state.batch)
    ...                 state.commit()                            # after each step
    ...             state.batch = 0
    ...         return [v.numpy() for v in model.variables]
    ...     return loop(state)
    >>> fl.distribute.run_with_recovery(cluster, train, max_restarts=3)   # doctest: +SKIP
    """
    if not callable(func):
        raise TypeError(f"hvd.elastic.run decorates a function func(state, ...), got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError(f"{getattr(func, '__qualname__', func)!r} decorated with hvd.elastic.run: its first "
                            f"argument must be an hvd.elastic state (ObjectState, TensorFlowKerasState, "
                            f"TensorFlowState), got {type(state).__name__}")
        try:
            if state.sync():
                state.on_reset()
            result = func(state, *args, **kwargs)
        except BaseException as err:
            if not _lost_peer(err):
                _forget(state._key)
                raise
            try:
                state.restore()
            except Exception:                 # (the error that brought us here matters more)
                pass
            err.add_note(f"hvd.elastic: restored {state._name} to its commit {state.commits}; under "
                         f"fl.distribute.run_with_recovery the lost worker is restarted and training resumes "
                         f"from the newest commit any worker holds")
            raise
        _forget(state._key)
        return result

    return wrapper
