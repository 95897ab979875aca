"""Death notices: the cluster's monitor tells the surviving tasks that a task died, so their
collectives fail at once, naming it, instead of waiting for a peer that will never answer.

A LocalCluster's liveness monitor sees a worker's exit within a tenth of a second (it is the
process's parent: it knows the exit code or the signal). Without help, the other workers learn it
only from the peer itself: a same-host peer's pid once the group has formed, else the silence of
its server (``peer_timeout``), and a group that is still forming has neither. So the monitor's
``on_dead`` hook (a :class:`Teller`) sends every other live task of the dead one's job a signed,
one-way ``task-gone`` message (task, pid, exit code, the call that restarts it); the task's server
keeps it (:func:`note`), and the cluster's communicator (:mod:`.zmq`) looks it up while it forms
its group and while it waits (:func:`known`).

A notice ends in two ways. ``cluster.restart(i)``, once the new process is up, has the Teller
*withdraw* it (:meth:`Teller.withdraw`: a ``task-gone`` message with ``back`` = the old pid) over
the same connection the notice took, so the task reads the two in order whatever state it was in
(alive, unresponsive, paused); a notice about the new process's own death (another pid) stays.
And a notice holds only while the receiving task's ClusterSpec is the one it had when the notice
came (the spec ``restart`` sends makes every older notice void): that alone was not enough,
because the spec comes over another connection, and a busy or stopped task may read it first.
"""
from __future__ import annotations

import logging
import threading

from .. import schemes as _schemes

__all__ = ["MSG_TYPE", "Teller", "note", "known", "describe"]

MSG_TYPE = "task-gone"
log = logging.getLogger("flowlab.cluster")


def describe(body: dict) -> str:
    """``exited (/job:worker/task:1, pid 812, killed by signal 9 (SIGKILL); cluster.restart(1)
    starts it again)``: the reason a collective gives for a peer named in a notice."""
    from ..errors import describe_exit

    pid = body.get("pid")
    how = describe_exit(body.get("exitcode"))
    restart = body.get("restart")
    again = f"; {restart} starts it again" if restart else ""
    return f"exited ({body.get('task')}{f', pid {pid}' if pid else ''}, {how}{again})"


# -- the task's side ---------------------------------------------------------------------------------
def note(server, body: dict) -> None:
    """Keep a notice on ``server`` (called by its ``task-gone`` handler, in its loop thread)."""
    task = body.get("task")
    if not isinstance(task, str):
        raise ValueError(f"a {MSG_TYPE} notice needs the task's name, got {task!r}")
    notes = server.state(__name__)
    if "back" in body:      # withdrawn: that process was replaced (only the notice about that pid)
        got = notes.get(task)
        if got is not None and got[1].get("pid") == body["back"]:
            del notes[task]
        return
    notes[task] = (server.spec, dict(body))


def known(server, task: str) -> str | None:
    """Why ``task`` is gone, if a notice that still holds says so (see the module docstring), else None."""
    notes = server.state(__name__)
    if not notes:
        return None
    got = notes.get(task)
    if got is None or got[0] is not server.spec:
        return None
    return describe(got[1])


# -- the monitor's side --------------------------------------------------------------------------------
class Teller:
    """A monitor's ``on_dead(monitor, state)`` hook: sends the ``task-gone`` notice to the other
    live tasks of the dead task's job (best effort; a task it cannot reach learns it later, by
    its own means). Connections are kept, one per receiving address."""

    def __init__(self, transport, key):
        from ..protocol import Signer, new_id

        self._transport = _schemes.keyed(transport, key)   # a keyed TCP handshake
        self._signer = Signer(key, new_id("gone"))
        self._conns: dict = {}
        self._withdrawn: dict = {}      # (task, pid) already withdrawn, oldest first: never told after that
        self._lock = threading.Lock()

    def __call__(self, monitor, dead) -> None:
        try:
            self._tell(monitor, dead)
        except Exception as e:  # noqa: BLE001 - a notice is a shortcut, never a new failure
            log.debug("could not tell the others that %s died: %s", dead.task, e)

    def _tell(self, monitor, dead):
        from ..spec import parse_task

        job = parse_task(dead.task)[0]
        restart = monitor.restart_hint(dead.task) if monitor.restart_hint is not None else None
        body = {"task": dead.task, "pid": dead.pid, "exitcode": dead.exitcode, "restart": restart}
        with monitor._lock:
            others = [s for s in monitor._tasks.values()
                      # not a paused task: its notice and the spec LocalCluster sends it on resume
                      # (``_catch_up``) would reach it together, over two connections, in either order,
                      # and a notice read after that spec would outlive the restart it predates
                      if s is not dead and s.status in ("alive", "unresponsive") and s.address
                      and s.server_id and parse_task(s.task)[0] == job]
        for s in others:
            try:
                self._send(s.address, s.server_id, body, (dead.task, dead.pid))
            except Exception as e:  # noqa: BLE001 - that task learns it later, by its own means
                log.debug("could not tell %s that %s died: %s", s.task, dead.task, e)

    def withdraw(self, monitor, task: str, pid) -> None:
        """``task``'s process ``pid`` was replaced (``cluster.restart``): withdraw the notice about
        it from every other task of its job that has an address, over the connection each notice
        took (so it is read after the notice). Best effort, like the notice itself; a notice about
        that pid that was not sent yet is never sent."""
        from ..spec import parse_task

        if pid is None:
            return
        with self._lock:
            self._withdrawn[(task, pid)] = None
            if len(self._withdrawn) > 4096:     # a long-lived cluster restarted very often
                del self._withdrawn[next(iter(self._withdrawn))]
        job = parse_task(task)[0]
        body = {"task": task, "back": pid}
        with monitor._lock:
            others = [s for s in monitor._tasks.values()
                      if s.task != task and s.status not in ("dead", "closed") and s.address
                      and s.server_id and parse_task(s.task)[0] == job]
        for s in others:
            try:
                self._send(s.address, s.server_id, body)
            except Exception as e:  # noqa: BLE001 - the new spec voids it as well (see the module docstring)
                log.debug("could not withdraw the notice about %s (pid %s) from %s: %s", task, pid, s.task, e)

    def _send(self, address, server_id, body, about=None):
        with self._lock:
            if about is not None and about in self._withdrawn:
                return      # the restart that replaced it ran first: telling now would outlive it
            conn = self._conns.get(address)
            if conn is not None:
                try:
                    conn.send(self._signer.pack(MSG_TYPE, server_id, body))
                    return
                except Exception:  # noqa: BLE001 - closed by the other side since: connect again
                    self._conns.pop(address, None)
                    conn.close()
            conn = self._conns[address] = self._transport.connect(address)
            conn.send(self._signer.pack(MSG_TYPE, server_id, body))

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
