"""``tf.train.Supervisor``: the training loop helper of the classic between-graph TF1 scripts.

::

    sv = tf.train.Supervisor(is_chief=(task_index == 0), logdir="/tmp/train", init_op=init_op,
                             global_step=global_step, save_model_secs=60)
    with sv.managed_session(server.target) as sess:
        while not sv.should_stop():
            sess.run(train_op)

It is a thin layer over :class:`SessionManager` (``_monitored.py``), which makes the sessions: the
chief's ``prepare_session`` restores the newest checkpoint of ``logdir`` through the Saver, or
runs ``init_op`` when there is none; the other workers' ``wait_for_session`` polls (every
``recovery_wait_secs``, at most half a second) until the chief has initialized every variable.
The stop flag is a :class:`Coordinator` (``sv.coord``): ``sv.request_stop()``, ``sv.should_stop()``.

Checkpoints (the chief, with a ``logdir`` and a Saver; ``saver=None`` turns them off): written
through ``tf.train.Saver`` as ``logdir/model.ckpt-<global step>``, once when the session is
ready, then whenever ``sv.should_stop()`` is asked and ``save_model_secs`` have passed since the
last one, and once more at ``sv.stop()``. TensorFlow saves from a background thread instead;
flowlab saves between two steps of the loop's own thread, so a save never runs at the same time
as a step. Summaries are not written (flowlab has no event files).
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings

from ._coordinator import Coordinator
from ._graphs import add_to_collection, get_collection, get_default_graph
from ._monitored import SessionManager, report_uninitialized_variables
from ._variables import global_variables, local_variables, global_variables_initializer, local_variables_initializer

__all__ = ["Supervisor"]


class _UseDefault:
    def __repr__(self):
        return "Supervisor.USE_DEFAULT"


USE_DEFAULT = _UseDefault()
_warned_summaries = False


def _made(graph, key, make):
    """The first item of the graph's collection ``key``, else ``make()`` (kept there if not None)."""
    found = get_collection(key, graph=graph)
    if found:
        return found[0]
    made = make()
    if made is not None:
        add_to_collection(key, made, graph=graph)
    return made


class Supervisor:
    """Makes the session of a (possibly distributed) training program and watches its loop.

    ``is_chief``: this worker initializes (or restores) the variables and writes checkpoints;
    the others wait for it. ``logdir``: where checkpoints go and come back from (None: nowhere).
    ``init_op``, ``ready_op``, ``local_init_op``, ``saver``, ``global_step``: default to the
    graph's global-variables initializer, ``report_uninitialized_variables()``, the local-variables
    initializer, ``tf.train.Saver()`` and the graph's global step; pass None for "none".
    ``save_model_secs``: seconds between checkpoints (0 or None: only at the start and at stop).
    The graph is finalized: build every op before the Supervisor.
    """

    USE_DEFAULT = USE_DEFAULT

    def __init__(self, graph=None, ready_op=USE_DEFAULT, ready_for_local_init_op=USE_DEFAULT, is_chief=True,
                 init_op=USE_DEFAULT, init_feed_dict=None, local_init_op=USE_DEFAULT, logdir=None,
                 summary_op=USE_DEFAULT, saver=USE_DEFAULT, global_step=USE_DEFAULT, save_summaries_secs=120,
                 save_model_secs=600, recovery_wait_secs=30, stop_grace_secs=120, checkpoint_basename="model.ckpt",
                 session_manager=None, summary_writer=USE_DEFAULT, init_fn=None, **_unused):
        global _warned_summaries
        self._graph = graph = graph if graph is not None else get_default_graph()
        with graph.as_default():      # defaults made once per graph, as TF1 keeps them in collections
            if init_op is USE_DEFAULT:
                init_op = _made(graph, "init_op", lambda: global_variables_initializer() if global_variables() else None)
            if ready_op is USE_DEFAULT:
                ready_op = _made(graph, "ready_op", report_uninitialized_variables)
            if local_init_op is USE_DEFAULT:
                local_init_op = _made(graph, "local_init_op",
                                      lambda: local_variables_initializer() if local_variables() else None)
            if global_step is USE_DEFAULT:
                from .v1_train import get_global_step
                global_step = get_global_step(graph)
            if saver is USE_DEFAULT:
                from ._saver import Saver
                saver = _made(graph, "savers", lambda: Saver() if global_variables() else None)
        if summary_op not in (None, USE_DEFAULT) and not _warned_summaries:
            _warned_summaries = True
            warnings.warn("tf.train.Supervisor: flowlab writes no summaries, so summary_op is never run (pass "
                          "summary_op=None; print or plot the values you fetch instead)", stacklevel=2)
        self._is_chief = bool(is_chief)
        self._init_op, self._init_feed_dict, self._init_fn = init_op, init_feed_dict, init_fn
        self._ready_op, self._local_init_op = ready_op, local_init_op
        self._saver, self._global_step = saver, global_step
        self._logdir = None if logdir is None else os.fspath(logdir)
        self._save_path = None if self._logdir is None else os.path.join(self._logdir, checkpoint_basename)
        self._save_model_secs = save_model_secs or 0
        self._save_summaries_secs = save_summaries_secs
        self._recovery_wait_secs = recovery_wait_secs
        self._stop_grace_secs = stop_grace_secs
        self._session_manager = session_manager or SessionManager(
            local_init_op=local_init_op, ready_op=ready_op, graph=graph, recovery_wait_secs=recovery_wait_secs)
        self._coord = Coordinator()
        self._sess = None
        self._saving = False           # the chief's checkpoints are on (start_standard_services)
        self._last_save = 0.0
        graph.finalize()

    # -- what it holds -----------------------------------------------------------------------------
    @property
    def coord(self) -> Coordinator:
        return self._coord

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    @property
    def session_manager(self) -> SessionManager:
        return self._session_manager

    @property
    def global_step(self):
        return self._global_step

    @property
    def saver(self):
        return self._saver

    @property
    def init_op(self):
        return self._init_op

    @property
    def init_feed_dict(self):
        return self._init_feed_dict

    @property
    def ready_op(self):
        return self._ready_op

    @property
    def summary_op(self):
        return None

    @property
    def summary_writer(self):
        return None

    @property
    def save_path(self):
        """Where checkpoints go: ``logdir/checkpoint_basename`` (then ``-<step>``), or None."""
        return self._save_path

    @property
    def save_model_secs(self):
        return self._save_model_secs

    @property
    def save_summaries_secs(self):
        return self._save_summaries_secs

    # -- sessions ----------------------------------------------------------------------------------
    def prepare_or_wait_for_session(self, master="", config=None, wait_for_checkpoint=False, max_wait_secs=7200,
                                    start_standard_services=True):
        """The session on ``master`` (a server's ``target``; "" for this process), once its
        variables are ready: the chief restores them from ``logdir``'s newest checkpoint or runs
        ``init_op`` (then starts checkpointing); another worker waits up to ``max_wait_secs``
        for the chief (``tf.errors.DeadlineExceededError`` naming what is still uninitialized)."""
        self._coord.clear_stop()
        manager = self._session_manager
        if self._is_chief:
            sess = manager.prepare_session(master, init_op=self._init_op, saver=self._saver,
                                           checkpoint_dir=self._logdir, wait_for_checkpoint=wait_for_checkpoint,
                                           max_wait_secs=max_wait_secs, config=config,
                                           init_feed_dict=self._init_feed_dict, init_fn=self._init_fn)
            self._sess = sess
            if start_standard_services:
                try:
                    self.start_standard_services(sess)
                except BaseException:
                    sess.close()
                    raise
        else:
            sess = manager.wait_for_session(master, config=config, max_wait_secs=max_wait_secs)
            self._sess = sess
        return sess

    def start_standard_services(self, sess):
        """The chief's services: checkpoints to ``logdir`` (one now, then every ``save_model_secs``).
        Returns the threads started: none, flowlab saves from the training loop's thread."""
        if not self._is_chief:
            raise RuntimeError("Supervisor.start_standard_services is for the chief (is_chief=True) only")
        self._sess = sess
        if self._save_path is not None and self._saver is not None:
            self._saving = True
            self._save(sess)
        return []

    def start_queue_runners(self, sess, queue_runners=None):
        """flowlab has no queue runners (feed with feed_dict or fl.data): starts nothing, returns []."""
        return []

    @contextlib.contextmanager
    def managed_session(self, master="", config=None, start_standard_services=True, close_summary_writer=True):
        """``with sv.managed_session(target) as sess:`` the session of ``prepare_or_wait_for_session``;
        at the end of the block, ``sv.stop()`` and the session is closed. An exception in the block
        stops the supervisor and then rises from the ``with``; the end of the input data
        (``StopIteration``, ``tf.errors.OutOfRangeError``) is a normal end."""
        sess = None
        try:
            sess = self.prepare_or_wait_for_session(master, config=config,
                                                    start_standard_services=start_standard_services)
            yield sess
        except Exception as e:
            self.request_stop(e)
        finally:
            try:
                if sess is not None:
                    self.stop(close_summary_writer=close_summary_writer)
            finally:
                if sess is not None:
                    sess.close()

    # -- the stop flag -----------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """Whether a stop was requested; the chief also writes a checkpoint here when
        ``save_model_secs`` have passed since the last one."""
        if self._saving and self._save_model_secs and time.monotonic() - self._last_save >= self._save_model_secs:
            self._save(self._sess)
        return self._coord.should_stop()

    def request_stop(self, ex=None):
        """Ask the loop to stop (``ex``: the exception that made it stop, raised again by ``stop``)."""
        self._coord.request_stop(ex)

    def wait_for_stop(self):
        """Block until a stop is requested."""
        self._coord.wait_for_stop()

    def stop(self, threads=None, close_summary_writer=True, ignore_live_threads=False):
        """Request a stop, write the chief's last checkpoint, wait for ``threads``, then raise the
        exception given to ``request_stop``, if any. The session stays open (close it, or use
        ``managed_session``, which does)."""
        self._coord.request_stop()
        try:
            self._coord.raise_requested_exception()
        except Exception:
            pass                        # an error stopped training: no checkpoint of its aftermath
        else:
            if self._saving and self._sess is not None and not self._sess._closed:
                self._save(self._sess)
        finally:
            self._saving = False
        self._coord.join(threads, stop_grace_period_secs=self._stop_grace_secs,
                         ignore_live_threads=ignore_live_threads)

    def _save(self, sess):
        self._saver.save(sess, self._save_path, global_step=self._global_step)
        self._last_save = time.monotonic()

    def __repr__(self):
        role = "chief" if self._is_chief else "non-chief"
        return f"<tf.train.Supervisor ({role}){' logdir=' + repr(self._logdir) if self._logdir else ''}>"
