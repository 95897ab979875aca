"""``tf.train.MonitoredTrainingSession``, ``SessionManager`` and session hooks: the training loop
of TF1's between-graph replication.

Each worker process builds the same graph under ``tf.train.replica_device_setter``, so its
variables live on the ps tasks under their names, shared by every worker (see ``_variables.py``).
One worker, the *chief*, initializes them; the others wait until they are initialized, then all
train at once, each step updating the shared variables (asynchronous updates)::

    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=(task_index == 0),
                                           hooks=[tf.train.StopAtStepHook(last_step=1000)]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

- ``SessionManager.prepare_session`` (the chief): a session that runs the init op, then checks
  that no variable is left uninitialized;
- ``SessionManager.wait_for_session`` (the others): a session that asks the tasks, every half
  second at most, which variables nobody has initialized yet, until none is left or the deadline
  passes (``DeadlineExceededError`` naming them);
- hooks see every ``run``: ``before_run`` adds fetches and feeds to the same ``Session.run``,
  ``after_run`` reads their values and may ``request_stop()``. ``StopAtStepHook`` stops when the
  shared global step reaches ``last_step``, whichever worker made it.
"""
from __future__ import annotations

import collections
import math
import sys
import time
import warnings

from ..core.errors import OpError
from ._graphs import get_default_graph
from ._session import Session, UninitializedReport
from ._variables import global_variables, global_variables_initializer

__all__ = ["MonitoredTrainingSession", "MonitoredSession", "SessionManager", "SessionRunHook", "SessionRunArgs",
           "SessionRunContext", "SessionRunValues", "StopAtStepHook", "DeadlineExceededError",
           "report_uninitialized_variables"]

WAIT_POLL = 0.5    # seconds between two looks at the tasks while waiting for the chief, at most


class DeadlineExceededError(OpError):
    """Waiting for something (the chief's initialization) took longer than allowed."""


# -- tf.report_uninitialized_variables -----------------------------------------------------------
def report_uninitialized_variables(var_list=None, name="report_uninitialized_variables"):
    """Something to ``sess.run``: the names of the variables in ``var_list`` (default: all of the
    graph's) that no session has initialized. On a cluster, a variable on a ps task counts as
    initialized once any worker has initialized it there."""
    return UninitializedReport(None if var_list is None else list(var_list), get_default_graph())


# -- hooks ---------------------------------------------------------------------------------------
class SessionRunArgs(collections.namedtuple("SessionRunArgs", ["fetches", "feed_dict", "options"])):
    """What a hook's ``before_run`` asks for: more ``fetches`` (and feeds) in the same run."""

    def __new__(cls, fetches, feed_dict=None, options=None):
        return super().__new__(cls, fetches, feed_dict, options)


class SessionRunValues(collections.namedtuple("SessionRunValues", ["results", "options", "run_metadata"])):
    """What a hook's ``after_run`` gets: ``results``, the values of the fetches it asked for."""


class SessionRunContext:
    """The run in progress: ``original_args`` (the caller's fetches and feeds), ``session`` (the
    plain session, for extra runs), and ``request_stop()``, which makes ``should_stop()`` true."""

    def __init__(self, original_args, session):
        self.original_args, self.session = original_args, session
        self._stop = False

    def request_stop(self):
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        return self._stop


class SessionRunHook:
    """Code that runs around a MonitoredSession's runs; override what you need."""

    def begin(self):
        """Before the session is made: the graph may still get ops here."""

    def after_create_session(self, session, coord):
        """The session exists (and its variables are ready)."""

    def before_run(self, run_context):
        """Before each run: return None or ``SessionRunArgs(fetches, feed_dict)`` to add to it."""
        return None

    def after_run(self, run_context, run_values):
        """After each run: ``run_values.results`` holds what ``before_run`` asked for."""

    def end(self, session):
        """When the MonitoredSession closes without an error."""


class StopAtStepHook(SessionRunHook):
    """Ask to stop once the global step reaches ``last_step``, or after ``num_steps`` more steps
    from where it was when the session started (give one of them). With several workers sharing
    the step, each stops when the shared value gets there."""

    def __init__(self, num_steps=None, last_step=None):
        if (num_steps is None) == (last_step is None):
            raise ValueError("StopAtStepHook: give exactly one of num_steps= and last_step=")
        self._num_steps, self._last_step = num_steps, last_step
        self._step = None

    def begin(self):
        from .v1_train import get_global_step
        self._step = get_global_step()
        if self._step is None:
            raise RuntimeError("StopAtStepHook needs a global step: make one with "
                               "tf.train.get_or_create_global_step() and pass it to minimize(loss, global_step=...)")

    def after_create_session(self, session, coord):
        if self._last_step is None:
            self._last_step = int(session.run(self._step)) + int(self._num_steps)

    def before_run(self, run_context):
        return SessionRunArgs(self._step)

    def after_run(self, run_context, run_values):
        # the fetched step is read before this run's increment, hence + 1; when that reaches the
        # end, read it again: other workers may have moved it since
        if int(run_values.results) + 1 >= self._last_step:
            if int(run_context.session.run(self._step)) >= self._last_step:
                run_context.request_stop()


# -- sessions that are ready -------------------------------------------------------------------
class SessionManager:
    """Makes sessions whose variables are ready: ``prepare_session`` initializes them (the chief),
    ``wait_for_session`` waits until another worker has (the others)."""

    def __init__(self, local_init_op=None, ready_op=None, ready_for_local_init_op=None, graph=None,
                 recovery_wait_secs=30, **_unused):
        self._graph = graph if graph is not None else get_default_graph()
        self._local_init_op = local_init_op
        self._ready_op = ready_op
        self._poll = min(float(recovery_wait_secs), WAIT_POLL)

    def _not_ready(self, sess) -> list:
        report = self._ready_op
        if report is None:
            with self._graph.as_default():
                report = UninitializedReport(global_variables(), self._graph)
        return [n.decode() if isinstance(n, bytes) else str(n) for n in report.evaluate(sess)]

    def prepare_session(self, master, init_op=None, saver=None, checkpoint_dir=None, checkpoint_filename_with_path=None,
                        wait_for_checkpoint=False, max_wait_secs=7200, config=None, init_feed_dict=None, init_fn=None):
        """A session on ``master`` whose variables are ready: the chief's. With a ``saver`` and a
        checkpoint (``checkpoint_filename_with_path``, else the newest in ``checkpoint_dir``; with
        ``wait_for_checkpoint``, one that appears within ``max_wait_secs``) it restores them from
        it; otherwise it runs ``init_op`` (and ``init_fn(sess)``)."""
        sess = Session(master, graph=self._graph, config=config)
        try:
            restored = self._restore(sess, saver, checkpoint_dir, checkpoint_filename_with_path,
                                     wait_for_checkpoint, max_wait_secs)
            if restored is None:
                if init_op is not None:
                    sess.run(init_op, feed_dict=init_feed_dict)
                if init_fn is not None:
                    init_fn(sess)
            if self._local_init_op is not None:
                sess.run(self._local_init_op)
            missing = self._not_ready(sess)
            if missing:
                raise RuntimeError(
                    f"{'the init op did not initialize' if restored is None else f'restoring {restored} left'} "
                    f"{', '.join(missing)} without a value (make the init op after the whole model, optimizer "
                    f"included{'' if restored is None else ', and save checkpoints of the same model'})")
        except BaseException:
            sess.close()
            raise
        return sess

    def _restore(self, sess, saver, checkpoint_dir, path, wait, max_wait_secs):
        """The checkpoint restored into ``sess``, or None when there is none to restore."""
        if saver is None or (path is None and checkpoint_dir is None):
            return None
        if path is None:
            from ..nn.checkpoint import latest_checkpoint
            start = time.monotonic()
            path = latest_checkpoint(checkpoint_dir)
            while path is None and wait and time.monotonic() - start < max_wait_secs:
                time.sleep(self._poll)
                path = latest_checkpoint(checkpoint_dir)
            if path is None:
                return None
        saver.restore(sess, path)
        return path

    def wait_for_session(self, master, config=None, max_wait_secs=float("inf")):
        """A session on ``master`` once every variable has been initialized (by the chief); after
        ``max_wait_secs`` seconds, DeadlineExceededError naming those still uninitialized."""
        sess = Session(master, graph=self._graph, config=config)
        start = time.monotonic()
        told = False
        try:
            while True:
                missing = self._not_ready(sess)
                if not missing:
                    if self._local_init_op is not None:
                        sess.run(self._local_init_op)
                    return sess
                waited = time.monotonic() - start
                if waited >= max_wait_secs:
                    raise DeadlineExceededError(
                        f"waited {waited:.3g} s for the chief to initialize the variables, but {_listed(missing)} "
                        f"still have no value: start the chief worker (is_chief=True, usually task 0), which runs "
                        f"the initializer, or raise max_wait_secs")
                if not told:
                    told = True
                    print(f"{master or 'this process'}: waiting for the chief to initialize {_listed(missing)}",
                          file=sys.stderr, flush=True)
                time.sleep(min(self._poll, max(0.0, max_wait_secs - waited)))
        except BaseException:
            sess.close()
            raise


def _listed(names, limit=8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# -- MonitoredSession ----------------------------------------------------------------------------
class MonitoredSession:
    """A session that runs hooks around each ``run`` and says when to stop (``should_stop()``).
    Made by ``MonitoredTrainingSession``; use it in a ``with`` block."""

    def __init__(self, session, hooks):
        self._sess, self._hooks = session, list(hooks)
        self._stop = False
        self._closed = False
        for hook in self._hooks:
            hook.after_create_session(session, None)

    @property
    def graph(self):
        return self._sess.graph

    def should_stop(self) -> bool:
        return self._stop or self._closed

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        """``Session.run(fetches, feed_dict)``, with what the hooks ask for fetched in the same run."""
        if self._closed:
            raise RuntimeError("this MonitoredSession is closed")
        context = SessionRunContext(SessionRunArgs(fetches, feed_dict, options), self._sess)
        extra, feeds = {}, feed_dict
        for i, hook in enumerate(self._hooks):
            request = hook.before_run(context)
            if request is None:
                continue
            if request.fetches is not None:
                extra[i] = request.fetches
            if request.feed_dict:
                feeds = {**(feeds or {}), **request.feed_dict}
        if extra:
            value, got = self._sess.run([fetches, extra], feed_dict=feeds)
        else:
            value, got = self._sess.run(fetches, feed_dict=feeds), {}
        for i, hook in enumerate(self._hooks):
            hook.after_run(context, SessionRunValues(got.get(i), options, run_metadata))
        self._stop = self._stop or context.stop_requested
        return value

    def close(self):
        self._close(ran_to_end=True)

    def _close(self, ran_to_end):
        if self._closed:
            return
        self._closed = True
        try:
            if ran_to_end:
                for hook in self._hooks:
                    hook.end(self._sess)
        finally:
            self._sess.close()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        self._close(ran_to_end=kind is None or issubclass(kind, StopIteration))
        return kind is not None and issubclass(kind, StopIteration)   # the end of the input data: a normal end

    def __repr__(self):
        return f"<tf.train.MonitoredSession on {self._sess.target or 'this process'}>"


_warned_checkpoints = False


def MonitoredTrainingSession(master="", is_chief=True, checkpoint_dir=None, scaffold=None, hooks=None,  # noqa: N802
                             chief_only_hooks=None, save_checkpoint_secs=None, save_summaries_steps=None,
                             save_summaries_secs=None, config=None, stop_grace_period_secs=120,
                             log_step_count_steps=100, max_wait_secs=7200, save_checkpoint_steps=None,
                             summary_dir=None, **_unused):
    """A MonitoredSession on ``master`` (a server's ``target``) for the default graph: the chief
    (``is_chief=True``) initializes every variable; the other workers wait up to ``max_wait_secs``
    for it. ``hooks`` run on every worker, ``chief_only_hooks`` on the chief.

    flowlab writes no checkpoints or summaries here (``checkpoint_dir`` and the ``save_*``
    arguments are accepted and ignored, with a warning; save with ``tf.train.Saver``, or use
    ``tf.train.Supervisor(logdir=...)``, which saves and restores), and
    finalizes the graph as TensorFlow does: build every op before the session."""
    global _warned_checkpoints
    if checkpoint_dir is not None and not _warned_checkpoints:
        _warned_checkpoints = True
        warnings.warn("MonitoredTrainingSession: flowlab neither saves nor restores checkpoints here "
                      f"(checkpoint_dir={checkpoint_dir!r} is ignored); save with tf.train.Saver, or use "
                      "tf.train.Supervisor(logdir=...), which saves and restores",
                      stacklevel=2)
    graph = get_default_graph()
    hooks = list(hooks or []) + (list(chief_only_hooks or []) if is_chief else [])
    with graph.as_default():
        for hook in hooks:
            hook.begin()
        init_op = global_variables_initializer()
    graph.finalize()
    manager = SessionManager(graph=graph)
    if is_chief:
        sess = manager.prepare_session(master, init_op=init_op, config=config)
    else:
        sess = manager.wait_for_session(master, config=config,
                                        max_wait_secs=math.inf if max_wait_secs is None else max_wait_secs)
    try:
        return MonitoredSession(sess, hooks)
    except BaseException:
        sess.close()
        raise
