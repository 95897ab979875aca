"""``flowlab run -np N script.py``: N local ranks of one script, as ``horovodrun`` starts them.

The launcher (:func:`launch`) makes a folder, writes a fresh cluster key there (mode 600) and starts
N processes ``python -m flowlab.cluster.collectives.launch script.py args`` with ``FLOWLAB_RUN_DIR``,
``FLOWLAB_RANK``, ``FLOWLAB_SIZE`` (and local rank/size) in their environment. Each rank
(:func:`join`) starts a :class:`~flowlab.cluster.server.Server` on a free 127.0.0.1 port, writes its
address into the folder, waits for everyone's, and becomes a task of that cluster: then
``fl.cluster.rank()``, ``world_size()``, the collectives and ``flowlab.horovod`` work as in a
LocalCluster worker, before the script's first line runs.

The launcher prints every rank's output line by line, prefixed with ``[rank]``; when a rank fails
it ends the others and exits with that rank's status; Ctrl-C ends them all (exit 130). Each rank
also dies with the launcher (Linux: ``PR_SET_PDEATHSIG``), so nothing is left behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["launch", "join"]

JOIN_TIMEOUT = 60.0


def join(timeout: float = JOIN_TIMEOUT):
    """Make this process rank ``FLOWLAB_RANK`` of the ``flowlab run`` group (see the module docstring)."""
    from .. import events, server as server_mod
    from ..spec import ClusterSpec

    folder, rank, size = os.environ["FLOWLAB_RUN_DIR"], int(os.environ["FLOWLAB_RANK"]), int(os.environ["FLOWLAB_SIZE"])
    srv = server_mod.Server(None, "worker", rank, port=0, key=server_mod.key_from_env())
    tmp = os.path.join(folder, f".rank-{rank}.tmp")
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
    """A rank's entry point: join the group, then run the script as ``__main__``."""
    import runpy

    if not argv:
        print("usage: python -m flowlab.cluster.collectives.launch script.py [args]", file=sys.stderr)
        return 2
    join()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


# -- the launcher -----------------------------------------------------------------------------------
def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


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
    """Run ``script`` on ``np_`` local ranks; the exit status (0, a failed rank's, or 130)."""
    import shutil
    import tempfile

    from ..protocol import new_key

    if np_ < 1:
        raise ValueError(f"flowlab run needs -np >= 1, got {np_}")
    out = out or sys.stdout
    folder = tempfile.mkdtemp(prefix="flowlab-run-")
    procs: list = []
    lock = threading.Lock()
    try:
        key_file = os.path.join(folder, "cluster.key")
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_key().hex())
        base = {k: v for k, v in os.environ.items() if k != "FLOWLAB_CLUSTER_KEY"}
        base.update(FLOWLAB_RUN_DIR=folder, FLOWLAB_SIZE=str(np_), FLOWLAB_LOCAL_SIZE=str(np_),
                    FLOWLAB_CLUSTER_KEY_FILE=key_file, PYTHONUNBUFFERED="1")
        pumps = []
        for r in range(np_):
            env = {**base, "FLOWLAB_RANK": str(r), "FLOWLAB_LOCAL_RANK": str(r)}
            p = subprocess.Popen([python or sys.executable, "-m", "flowlab.cluster.collectives.launch", script,
                                  *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True, preexec_fn=_die_with_parent)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(r, p.stdout, out, lock), daemon=True)
            t.start()
            pumps.append(t)
        status = 0
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r, status = failed[0]
                with lock:
                    print(f"flowlab run: rank {r} exited with status {status}; ending the other ranks",
                          file=sys.stderr, flush=True)
                _end(procs)
                status = status if status > 0 else 128 - status
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
        for t in pumps:
            t.join(2.0)
        return status
    except KeyboardInterrupt:
        print("flowlab run: interrupted; ending every rank", file=sys.stderr, flush=True)
        _end(procs)
        return 130
    finally:
        _end(procs, grace=1.0)
        _remove_lanes(folder)
        shutil.rmtree(folder, ignore_errors=True)


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
