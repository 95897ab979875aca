"""``flowlab run -np N script.py``: N local ranks of one script, as ``horovodrun`` starts them.

The launcher (:func:`launch`) makes a folder, writes a fresh cluster key there (mode 600) and starts
N processes ``python -m flowlab.cluster.collectives.launch script.py args`` with ``FLOWLAB_RUN_DIR``,
``FLOWLAB_RANK``, ``FLOWLAB_SIZE`` (and local rank/size) in their environment. Each rank
(:func:`join`) starts a :class:`~flowlab.cluster.server.Server` on a free 127.0.0.1 port, writes its
address into the folder, waits for everyone's, and becomes a task of that cluster: then
``fl.cluster.rank()``, ``world_size()``, the collectives and ``flowlab.horovod`` work as in a
LocalCluster worker, before the script's first line runs.

The launcher prints every rank's output line by line, prefixed with ``[rank]``; Ctrl-C ends every
rank (exit 130).

**Nothing outlives the launcher.** Each rank watches the launcher as a LocalCluster worker watches
its parent (:func:`.worker.die_with_parent`, :func:`.worker.watch_parent`): Linux's parent-death
signal (SIGKILL, which also ends a stopped rank) plus a poll of ``getppid()``; on SIGTERM a rank
removes its lane socket and shared segments before it ends. The run folder is named with the
launcher's owner tag (:mod:`.leftovers`), so if the launcher itself is SIGKILLed, the next flowlab
process's sweep removes it (and the ranks' lane sockets).

**A rank that fails ends the run, and the others hear why at once.** The launcher waits on every
rank in a thread of its own, so it learns of an exit when it happens. When a rank exits with a
non-zero status or a signal, the launcher sends every other rank a signed ``task-gone`` notice
(:mod:`._gone`: task, pid, exit code or signal; each rank publishes its server id in the run
folder for this), so a survivor blocked in a collective, or forming its group, raises
:class:`~.errors.PeerLostError` naming the dead rank, its pid and how it ended within tens of
milliseconds, not at the deadline. A rank that ends its script by an exception (other than a
collective error, which a peer caused) or a non-zero ``sys.exit`` sends the same notice itself just
before it exits: its process is still there then, so the survivors learn the exit code before they
could see the pid gone (a rank killed by a signal is named by the launcher's notice, or, if the
survivors see its pid gone first, by pid alone). The launcher then gives the others
:data:`GRACE_S` to end on their own (printing their own errors), ends the rest (SIGTERM, then
SIGKILL), and exits with the first failed rank's status after a root-cause line: which rank failed
first, its pid and how, and how each other rank ended.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["launch", "join", "GRACE_S"]

JOIN_TIMEOUT = 60.0
GRACE_S = 2.0        # after a rank failed, the others get this long to end on their own before SIGTERM
NOTICE_WAIT_S = 1.0  # a failing rank waits at most this long for its peers to read its death notice


def join(timeout: float = JOIN_TIMEOUT):
    """Make this process rank ``FLOWLAB_RANK`` of the ``flowlab run`` group (see the module docstring)."""
    from .. import events, server as server_mod
    from ..spec import ClusterSpec

    folder, rank, size = os.environ["FLOWLAB_RUN_DIR"], int(os.environ["FLOWLAB_RANK"]), int(os.environ["FLOWLAB_SIZE"])
    srv = server_mod.Server(None, "worker", rank, port=0, key=server_mod.key_from_env())
    tmp = os.path.join(folder, f".rank-{rank}.tmp")
    with open(tmp, "w") as f:      # the server's id, for the launcher's death notices (written first)
        f.write(srv.id)
    os.replace(tmp, os.path.join(folder, f"rank-{rank}.id"))
    with open(tmp, "w") as f:
        f.write(srv.address)
    os.replace(tmp, os.path.join(folder, f"rank-{rank}.addr"))
    deadline = time.monotonic() + timeout
    addresses = [None] * size
    while True:
        for r in range(size):
            if addresses[r] is None:
                try:
                    with open(os.path.join(folder, f"rank-{r}.addr")) as f:
                        addresses[r] = f.read().strip()
                except FileNotFoundError:
                    pass
        missing = [r for r, a in enumerate(addresses) if a is None]
        if not missing:
            break
        if time.monotonic() > deadline:
            srv.stop()
            raise TimeoutError(f"flowlab run: rank {rank} waited {timeout:g} s for ranks {missing} to start")
        time.sleep(0.02)
    srv.spec = ClusterSpec({"worker": addresses})
    server_mod._process_server = srv
    log = events.default_log()
    log.task, log.rank = srv.name, rank
    return srv


def _main(argv) -> int:
    """A rank's entry point: watch the launcher, join the group, then run the script as ``__main__``."""
    import runpy

    from .. import worker

    if not argv:
        print("usage: python -m flowlab.cluster.collectives.launch script.py [args]", file=sys.stderr)
        return 2
    parent = int(os.environ.get("FLOWLAB_RUN_PARENT") or 0) or None
    worker.die_with_parent(parent)
    worker.watch_parent(parent, stdin=False, who=f"flowlab run rank {os.environ.get('FLOWLAB_RANK')}")
    worker.clean_up_on_sigterm()
    srv = join()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) or e.code is None else 1
        if code:
            _tell_peers(srv, code)
        raise
    except BaseException as e:
        from .errors import CollectiveError
        if not isinstance(e, CollectiveError):    # (one caused by a peer: the launcher names the first)
            _tell_peers(srv, 1)
        raise
    return 0


def _tell_peers(srv, exitcode: int) -> None:
    """This rank is about to exit with ``exitcode``: send the others the death notice now, so their
    collectives fail naming it (and the status) before its process is even gone."""
    folder = os.environ.get("FLOWLAB_RUN_DIR")
    if not folder or srv.spec is None:
        return
    size = srv.spec.num_tasks("worker")
    tmp = os.path.join(folder, f".failed-{srv.task_index}.tmp")
    try:          # for the launcher's root cause: this rank failed now, before the peers it brings down
        with open(tmp, "w") as f:
            f.write(f"{time.time():.6f} {exitcode}")
        os.replace(tmp, os.path.join(folder, f"rank-{srv.task_index}.failed"))
    except OSError:
        pass
    body = {"task": srv.name, "pid": os.getpid(), "exitcode": exitcode, "restart": None}
    with _Notices(srv.key, folder) as notices:
        for r in range(size):
            if r != srv.task_index:
                notices.send(r, body)
        notices.confirm(NOTICE_WAIT_S)     # this process exits next: its connections close with it


class _Notices:
    """Signed ``task-gone`` notices (:mod:`._gone`) to the ranks of a run, by rank (best effort:
    a rank that has not published its address and id yet, or is gone, is skipped)."""

    def __init__(self, key: bytes, folder: str):
        from ..protocol import Signer, new_id

        self._signer = Signer(key, new_id("run"))
        self._key = key
        self._folder = folder
        self._conns: dict = {}

    def send(self, rank: int, body: dict) -> bool:
        from . import _gone

        try:
            conn = self._conns.get(rank)
            if conn is None:
                with open(os.path.join(self._folder, f"rank-{rank}.addr")) as f:
                    address = f.read().strip()
                with open(os.path.join(self._folder, f"rank-{rank}.id")) as f:
                    server_id = f.read().strip()
                from .. import schemes       # keyed: TCP's handshake, off the lane
                conn = self._conns[rank] = (schemes.for_address(address, self._key).connect(address), server_id)
            conn[0].send(self._signer.pack(_gone.MSG_TYPE, conn[1], body))
            return True
        except Exception:  # noqa: BLE001 - a notice is a shortcut: the rank learns it later by its own means
            return False

    def confirm(self, limit: float) -> None:
        """Wait (at most ``limit`` seconds) until every rank told has read its notice: a ``ping``
        after it on the same connection is answered only then (a TCP connection that closes drops
        what it has not sent yet)."""
        end = time.monotonic() + limit
        waiting = []
        for conn, server_id in self._conns.values():
            try:
                conn.send(self._signer.pack("ping", server_id, {}))
                waiting.append(conn)
            except Exception:  # noqa: BLE001 - best effort, as the notice
                pass
        for conn in waiting:
            try:
                conn.recv(max(0.0, end - time.monotonic()))
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        for conn, _ in self._conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# -- the launcher -----------------------------------------------------------------------------------


def _pump(rank, stream, out, lock):
    prefix = f"[{rank}] "
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        with lock:
            out.write(prefix + text if text.endswith("\n") else prefix + text + "\n")
            out.flush()
    stream.close()


def _end(procs, grace: float = 3.0):
    """SIGTERM every rank's process group that still runs, SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, sig)     # the rank leads its own session: its group is ours to end
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + grace
        for p in live:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def launch(np_: int, script: str, args=(), python: str | None = None, out=None) -> int:
    """Run ``script`` on ``np_`` local ranks; the exit status (0, the first failed rank's, or 130)."""
    import queue
    import shutil
    import tempfile

    from .. import leftovers
    from ..protocol import new_key

    if np_ < 1:
        raise ValueError(f"flowlab run needs -np >= 1, got {np_}")
    out = out or sys.stdout
    # named with this process's owner tag: if the launcher is SIGKILLed, a later sweep removes it
    folder = tempfile.mkdtemp(prefix=leftovers.folder_prefix() + "run-")
    procs: list = []
    lock = threading.Lock()
    notices = None
    try:
        key = new_key()
        key_file = os.path.join(folder, "cluster.key")
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex())
        base = {k: v for k, v in os.environ.items() if k != "FLOWLAB_CLUSTER_KEY"}
        base.update(FLOWLAB_RUN_DIR=folder, FLOWLAB_SIZE=str(np_), FLOWLAB_LOCAL_SIZE=str(np_),
                    FLOWLAB_CLUSTER_KEY_FILE=key_file, FLOWLAB_RUN_PARENT=str(os.getpid()), PYTHONUNBUFFERED="1")
        pumps, exits = [], queue.SimpleQueue()
        for r in range(np_):
            env = {**base, "FLOWLAB_RANK": str(r), "FLOWLAB_LOCAL_RANK": str(r)}
            # no preexec_fn (unsafe with the pump threads): the rank asks for its parent-death signal itself
            p = subprocess.Popen([python or sys.executable, "-m", "flowlab.cluster.collectives.launch", script,
                                  *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(r, p.stdout, out, lock), daemon=True)
            t.start()
            pumps.append(t)
            threading.Thread(target=_await_exit, args=(r, p, exits), daemon=True).start()
        ended: list = []           # (rank, status), in the order the ranks ended
        status = 0
        first = None
        grace_end = None
        while len(ended) < np_:
            wait = 0.2 if grace_end is None else min(0.2, grace_end - time.monotonic())
            if wait <= 0:
                break
            try:
                r, code, at = exits.get(timeout=wait)     # (a timeout keeps Ctrl-C prompt)
            except queue.Empty:
                continue
            ended.append((r, code))
            if code != 0 and first is None:
                # a rank that failed on its own says so before it exits (``_tell_peers``): the peers
                # it brought down may exit before it does
                first, grace_end = _first_failure(folder, r, code, at), time.monotonic() + GRACE_S
                r, code = first
                with lock:
                    print(f"flowlab run: rank {r} exited with status {code} first (pid {procs[r].pid}, "
                          f"{_how(code)}); telling the other ranks, then ending them", file=sys.stderr, flush=True)
                notices = _Notices(key, folder)
                body = {"task": f"/job:worker/task:{r}", "pid": procs[r].pid, "exitcode": code, "restart": None}
                for other in range(np_):
                    if other != r and procs[other].poll() is None:
                        notices.send(other, body)
        if first is not None:
            _end(procs)
            for t in pumps:
                t.join(2.0)
            r = first[0]
            if procs[r].returncode not in (None, 0) and (r, procs[r].returncode) in ended:
                first = (r, procs[r].returncode)      # how it really ended, once it did by itself
            with lock:
                print(_root_cause(first, ended, procs), file=sys.stderr, flush=True)
            code = first[1]
            status = code if code > 0 else 128 - code
        for t in pumps:
            t.join(2.0)
        return status
    except KeyboardInterrupt:
        print("flowlab run: interrupted; ending every rank", file=sys.stderr, flush=True)
        _end(procs)
        return 130
    finally:
        _end(procs, grace=1.0)
        if notices is not None:
            notices.close()
        _remove_lanes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _await_exit(rank, proc, exits) -> None:
    code = proc.wait()
    exits.put((rank, code, time.time()))


def _first_failure(folder, rank, code, at) -> tuple:
    """``(rank, status)`` of the run's first failure: the earliest of the failures ranks announced
    in ``folder`` (``rank-N.failed``: time and exit code) and ``rank``'s exit with ``code`` at ``at``."""
    first = (at, rank, code)
    for name in os.listdir(folder):
        if name.startswith("rank-") and name.endswith(".failed"):
            try:
                with open(os.path.join(folder, name)) as f:
                    when, status = f.read().split()
                first = min(first, (float(when), int(name[5:-7]), int(status)))
            except (OSError, ValueError):
                pass
    return first[1], first[2]


def _how(code) -> str:
    from ..errors import describe_exit
    return describe_exit(code)


def _root_cause(first, ended, procs) -> str:
    """The launcher's last word after a failure: the rank that failed first, then how each other ended."""
    r, code = first
    lines = [f"flowlab run: root cause: rank {r} (pid {procs[r].pid}) failed first: {_how(code)}"]
    seen = {rank for rank, _ in ended}
    for rank, c in ended:
        if rank != r:
            lines.append(f"  rank {rank} (pid {procs[rank].pid}): {_how(c)} on its own, after rank {r}"
                         if c != 0 else f"  rank {rank} (pid {procs[rank].pid}): finished (exit code 0)")
    for rank, p in enumerate(procs):
        if rank not in seen:
            lines.append(f"  rank {rank} (pid {p.pid}): ended by the launcher ({_how(p.returncode)})")
    return "\n".join(lines)


def _remove_lanes(folder) -> None:
    """Remove the local-lane sockets of ranks that were ended by a signal (no exit handlers ran)."""
    from .. import unix
    for name in os.listdir(folder):
        if name.startswith("rank-") and name.endswith(".addr"):
            try:
                with open(os.path.join(folder, name)) as f:
                    unix.remove_if_dead(f.read().strip())
            except (OSError, ValueError):
                pass


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
