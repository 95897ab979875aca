"""What goes wrong in a cluster, as exceptions that say which task, which process and why.

Every error a cluster call raises is a :class:`ClusterError`. The three a learner meets most:

- :class:`WorkerDiedError`: the task's process is gone (names its pid and exit code or signal).
- :class:`WorkerUnresponsiveError`: the process exists but stopped answering (stopped, hung).
- :class:`RemoteError`: the task ran the code and the code raised; carries the remote traceback.
  Where the remote exception's class can be found here, the error raised is also an instance of it,
  so ``except ZeroDivisionError:`` still works around a remote call.

Interrupting a call that waits on tasks (the notebook's Interrupt button) raises
:class:`Interrupted`, a KeyboardInterrupt that says what was cancelled on the tasks and what still
runs there; a later call to a task still busy with it raises :class:`WorkerBusyError`.

Each carries the last lines of the task's log when the cluster has one (a LocalCluster does).
"""
from __future__ import annotations

import signal as _signal

__all__ = ["ClusterError", "WorkerDiedError", "WorkerUnresponsiveError", "RemoteError",
           "ClusterTimeoutError", "ProtocolError", "WorkerPausedError", "WorkerBusyError", "Interrupted",
           "describe_exit"]


class ClusterError(RuntimeError):
    """Something about a cluster task went wrong; ``task`` names it (a string like
    ``/job:worker/task:1``) and ``pid`` is its process id where known."""

    def __init__(self, message: str, task: str | None = None, pid: int | None = None,
                 log_tail: str | None = None):
        if log_tail:
            message += "\nlast lines of its log:\n" + _indent(log_tail)
        super().__init__(message)
        self.task, self.pid, self.log_tail = task, pid, log_tail

    def __str__(self):   # our message, even when mixed with a class that words it otherwise (KeyError)
        return BaseException.__str__(self)


class WorkerDiedError(ClusterError):
    """The task's process exited; ``exitcode`` (>= 0) or ``signal`` (a signal number) says how."""

    def __init__(self, task, pid=None, exitcode=None, signal=None, log_tail=None, doing=None, restart=None):
        self.exitcode, self.signal, self.restart = exitcode, signal, restart
        what = f" while {doing}" if doing else ""
        how = f"; start it again with {restart}" if restart else ""
        super().__init__(f"{task}{_pid(pid)} died{what}: {describe_exit(exitcode, signal)}{how}", task, pid, log_tail)


class WorkerUnresponsiveError(ClusterError):
    """The task's process is there but sent no heartbeat for ``silent_for`` seconds (stopped with
    SIGSTOP, frozen, or starved). ``state`` is its process state where known (e.g. ``T (stopped)``)."""

    def __init__(self, task, pid=None, silent_for=0.0, state=None, log_tail=None, doing=None, restart=None):
        self.silent_for, self.state, self.restart = silent_for, state, restart
        what = f" while {doing}" if doing else ""
        st = f"; process state {state}" if state else ""
        how = f"; if it stays silent, {restart} ends it and starts a new one" if restart else ""
        super().__init__(f"{task}{_pid(pid)} stopped answering{what}: no heartbeat for {silent_for:.1f} s{st}{how}",
                         task, pid, log_tail)


class WorkerPausedError(WorkerUnresponsiveError):
    """The task was paused on purpose (``cluster.pause``, SIGSTOP) ``paused_for`` seconds ago and
    answers nothing until it is resumed; ``restart`` here holds the call that resumes it."""

    def __init__(self, task, pid=None, paused_for=0.0, state=None, log_tail=None, doing=None, resume=None):
        self.silent_for = self.paused_for = paused_for
        self.state, self.restart = state, resume
        what = f" while {doing}" if doing else ""
        st = f"; process state {state}" if state else ""
        how = f"; {resume} wakes it" if resume else ""
        ClusterError.__init__(self, f"{task}{_pid(pid)} is paused{what}: stopped (SIGSTOP) {paused_for:.1f} s ago by "
                              f"fault injection, so it answers nothing{st}{how}", task, pid, log_tail)


class ClusterTimeoutError(ClusterError, TimeoutError):
    """A call's own deadline passed while its task still looked alive."""


class WorkerBusyError(ClusterError):
    """The task is still running a call that was interrupted here and did not stop (stuck in C
    code); a new request would wait behind it. ``restart``: the call that ends it, where known."""

    def __init__(self, message, task=None, pid=None, restart=None):
        super().__init__(message, task, pid)
        self.restart = restart


class Interrupted(KeyboardInterrupt):
    """A call waiting on tasks was interrupted (KeyboardInterrupt, e.g. the notebook's Interrupt
    button). ``cancelled``: the tasks whose work was stopped; ``still_running``: those whose work
    did not stop in time (each still busy until it finishes or is restarted)."""

    def __init__(self, message, cancelled=(), still_running=()):
        super().__init__(message)
        self.cancelled, self.still_running = list(cancelled), list(still_running)

    def __str__(self):
        return BaseException.__str__(self)


class ProtocolError(ClusterError):
    """A message failed a check (signature, replay, shape); the receiver drops it and keeps serving."""


class RemoteError(ClusterError):
    """Code run on a task raised. ``remote_type`` is the exception's class name there,
    ``remote_traceback`` its formatted traceback (as text)."""

    def __init__(self, task, remote_type, remote_message, remote_traceback="", pid=None):
        self.remote_type, self.remote_message, self.remote_traceback = remote_type, remote_message, remote_traceback
        text = f"{remote_type}: {remote_message}" if remote_message else remote_type
        tb = f"\n\nremote traceback ({task}):\n{_indent(remote_traceback.rstrip())}" if remote_traceback else ""
        super().__init__(f"{task}{_pid(pid)} raised {text}{tb}", task, pid)

    def __reduce__(self):   # a plain RemoteError on the other side (the mixed-in class may not exist there)
        return RemoteError, (self.task, self.remote_type, self.remote_message, self.remote_traceback, self.pid)


def remote_error(task, remote_type, message, traceback, pid=None, cls=None) -> RemoteError:
    """A RemoteError that is also an instance of ``cls`` (the remote exception's class) when that
    class can be subclassed; plain RemoteError otherwise."""
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, RemoteError):
        try:
            sub = type(f"RemoteError[{cls.__name__}]", (RemoteError, cls), {"__module__": __name__})
            err = Exception.__new__(sub)
            RemoteError.__init__(err, task, remote_type, message, traceback, pid)
            return err
        except TypeError:   # a class whose layout forbids the mix (rare C extension types)
            pass
    return RemoteError(task, remote_type, message, traceback, pid)


def describe_exit(exitcode, signal=None) -> str:
    """``exit code 3`` / ``killed by signal 9 (SIGKILL)`` / ``exit status unknown``."""
    if signal is None and exitcode is not None and exitcode < 0:   # subprocess's convention
        exitcode, signal = None, -exitcode
    if signal is not None:
        try:
            name = _signal.Signals(signal).name
        except ValueError:
            name = "?"
        return f"killed by signal {signal} ({name})"
    if exitcode is None:
        return "exit status unknown"
    return f"exit code {exitcode}"


def _pid(pid):
    return f" (pid {pid})" if pid else ""


def _indent(text):
    return "\n".join("    " + line for line in text.splitlines())
