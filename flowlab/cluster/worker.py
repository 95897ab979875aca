"""A task's process: what runs in each worker of a LocalCluster, and behind ``flowlab worker``.

A LocalCluster starts each task as ``python -c BOOT`` (see :func:`command`): the bootstrap imports
this module without running ``flowlab/__init__`` (which loads numpy and the whole engine), so a
worker is ready in about the time of a bare interpreter plus pyzmq; flowlab's engine and numpy
load in the worker when code first uses them (``fl.constant``: the first attribute looked up on
the ``flowlab`` package runs its ``__init__``). The parent writes the task's configuration, key included, as
one JSON line on the child's stdin (so the key is never on a command line or in the environment)
and keeps the pipe open. The child:

1. asks the kernel for SIGKILL when its parent ends (Linux's parent-death signal, as Jupyter
   kernels do; SIGKILL also ends a worker that is SIGSTOPped, which could run no watchdog), and
   exits at once if the parent is already gone;
2. reads that line, then watches its parent on a thread: end of file on stdin means the parent
   closed the cluster (or restarted this task, or died), and a parent pid that changed means the
   parent is gone although something else still holds the pipe (a process it forked after the
   cluster started); either way the worker removes what it made (its lane socket, the shared
   segments it still has linked: :mod:`.leftovers`) and exits, so nothing is orphaned. SIGTERM
   does the same cleanup before it ends the worker as SIGTERM would. The worker runs in a session
   of its own, so the notebook's Interrupt button (SIGINT to the kernel's process group) does not
   reach it: instead the interrupted client sends a signed ``cancel`` (see :mod:`.server`), which
   interrupts the user's code on this process's main thread;
3. binds its port, starts its heartbeat (which first says ``ready`` with its address), and serves:
   the message loop on a thread, user code (``run``) on the main thread. A second after it is
   ready, it sweeps, in the background, what killed flowlab processes left on the host
   (:func:`.leftovers.sweep`). Before it is ready it registers :func:`faulthandler.register` for
   ``STACK_SIGNAL`` (SIGUSR1), so ``LocalCluster.stack`` can read every thread's stack even while
   user code runs.

The parent-death signal fires when the *thread* that started the worker ends, not the process, so
the parent starts every worker from one thread that lives as long as it does (:func:`spawn`).
The ranks of ``flowlab run`` watch their launcher with the same code (:func:`die_with_parent`,
:func:`watch_parent` without stdin, :func:`clean_up_on_sigterm`; see :mod:`.collectives.launch`).

``flowlab worker --cluster spec.json --job worker --task 1`` runs one task from a shell instead
(:func:`serve_task`), with the key from ``FLOWLAB_CLUSTER_KEY`` or a key file.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["command", "spawn", "child_main", "serve_task", "die_with_parent", "watch_parent", "clean_up_on_sigterm",
           "STACK_SIGNAL"]

PARENT_POLL_S = 0.5      # how often a worker checks that its parent still runs (besides stdin and the signal)
SWEEP_DELAY_S = 1.0      # a worker sweeps what dead processes left this long after it is ready
_PR_SET_PDEATHSIG = 1
STACK_SIGNAL = getattr(signal, "SIGUSR1", None)   # a LocalCluster task writes every thread's stack on it
_stack_file = None

# The bootstrap puts a "flowlab" package in sys.modules whose __init__ has not run: its submodules
# import as usual (flowlab.cluster.* here), and the first attribute looked up on the package itself
# (``fl.constant`` in user code) runs the real flowlab/__init__.py, then answers.
_BOOT = """\
import sys, importlib.util as u
spec = u.spec_from_file_location("flowlab", {init!r}, submodule_search_locations=[{pkg!r}])
m = u.module_from_spec(spec)
def __getattr__(name, m=m, spec=spec):
    del m.__dict__["__getattr__"]
    spec.loader.exec_module(m)
    return getattr(m, name)
m.__getattr__ = __getattr__
sys.modules["flowlab"] = m
del u, spec, m, __getattr__
import flowlab.cluster.worker
flowlab.cluster.worker.child_main({parent})
"""


def command(python: str | None = None) -> list[str]:
    """The argv that starts a LocalCluster task (from this process): this interpreter and the
    light bootstrap, which is told this process's pid (the parent it watches)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = _BOOT.format(pkg=pkg, init=os.path.join(pkg, "__init__.py"), parent=os.getpid())
    return [python or sys.executable, "-c", boot]


# -- the parent's side: one long-lived thread starts every worker ----------------------------------
_spawn_lock = threading.Lock()
_spawn_jobs: "queue.SimpleQueue | None" = None


def _spawner(jobs) -> None:
    while True:
        args, kwargs, done = jobs.get()
        try:
            done.append((True, subprocess.Popen(args, **kwargs)))
        except BaseException as e:   # noqa: BLE001 - handed to the caller, raised there
            done.append((False, e))
        done[0].set()


def spawn(args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, run on this process's spawner thread. A worker's
    parent-death signal fires when the thread that forked it ends, so a worker started from a
    short-lived thread (a widget's callback, a user's thread) would die with that thread; the
    spawner thread lives as long as the process."""
    global _spawn_jobs
    with _spawn_lock:
        if _spawn_jobs is None:
            _spawn_jobs = queue.SimpleQueue()
            threading.Thread(target=_spawner, args=(_spawn_jobs,), name="flowlab-spawner", daemon=True).start()
        jobs = _spawn_jobs
    done: list = [threading.Event()]
    jobs.put((args, kwargs, done))
    done[0].wait()
    ok, got = done[1]
    if not ok:
        raise got
    return got


def _forget_spawner() -> None:       # a forked child has no spawner thread: it starts its own
    global _spawn_jobs, _spawn_lock
    _spawn_jobs, _spawn_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


# -- the worker's side: die with the parent --------------------------------------------------------
# (also used by the ranks of ``flowlab run``, :mod:`.collectives.launch`, whose parent is the launcher)
def die_with_parent(parent: int | None) -> None:
    """Ask for SIGKILL when the parent ends (Linux), then exit if it has ended already."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):    # no prctl: the poll of the parent pid still works
            pass
    if parent and os.getppid() != parent:
        os._exit(0)       # the parent died before the signal was asked for


def _exit_now(code: int) -> None:
    """Remove what this worker made that others would trip over, then end without further ado."""
    _remove_lane()
    from . import leftovers
    leftovers.release_owned()
    os._exit(code)


def watch_parent(parent: int | None, stdin: bool = True, who: str = "flowlab worker"):
    """A thread that ends this process when its parent is gone: a parent pid that changed (the
    parent-death signal's backup, and what catches a parent that died while something it forked
    still holds the pipe), and with ``stdin``, stdin's end of file (the parent closed the pipe).
    Before it exits it removes what this process made (lane socket, shared segments)."""
    def watch():
        poller = select.poll()
        if stdin:
            poller.register(0, select.POLLIN | select.POLLHUP)
        why = None
        while why is None:
            if stdin and poller.poll(int(PARENT_POLL_S * 1000)):
                try:
                    if not os.read(0, 4096):
                        why = "stdin closed (the cluster was closed, or its process is gone)"
                except OSError:
                    why = "stdin closed (the cluster was closed, or its process is gone)"
            elif not stdin:
                time.sleep(PARENT_POLL_S)
            if why is None and parent and os.getppid() != parent:
                why = f"its parent (pid {parent}) is gone"
        print(f"{who}: {why}; exiting", file=sys.stderr, flush=True)
        _exit_now(0)
    threading.Thread(target=watch, name="flowlab-parent-watch", daemon=True).start()


def clean_up_on_sigterm() -> None:
    """On SIGTERM, remove what this process made (lane socket, shared segments), then end as
    SIGTERM does (main thread only)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    """Clean up, then end as SIGTERM does (the exit status still says so)."""
    _remove_lane()
    from . import leftovers
    leftovers.release_owned()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _sweep() -> None:
    import time

    from . import leftovers
    time.sleep(SWEEP_DELAY_S)
    try:
        removed = leftovers.sweep()
    except Exception as e:  # noqa: BLE001 - a sweep that fails must not take the worker down
        logging.getLogger("flowlab.cluster").warning("sweeping what dead flowlab processes left failed: %s", e)
        return
    if any(removed.values()):
        logging.getLogger("flowlab.cluster").info("removed what dead flowlab processes left: %s", removed)


def _remove_lane():
    """Remove this task's local-lane socket file (``os._exit`` skips every cleanup)."""
    from . import server as server_mod
    srv = server_mod._process_server
    listener = getattr(srv, "_listener", None)
    path = getattr(listener, "lane_path", None)
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def register_stack_dump(path: str) -> None:
    """On :data:`STACK_SIGNAL`, write every thread's Python stack to ``path`` (appended), from a C
    signal handler (:func:`faulthandler.register`): it works while the main thread is deep in a
    long computation or a C call that holds the GIL. ``LocalCluster.stack`` sends the signal."""
    global _stack_file
    if STACK_SIGNAL is None:
        return
    import faulthandler

    _stack_file = open(path, "ab")     # O_APPEND: the parent may empty it between dumps
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)


def _logging():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")


def _preload(modules):
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:   # reported in the log; the code that needs it will raise
            logging.getLogger("flowlab.cluster").warning("preload of %s failed: %s", name, e)


def child_main(parent: int | None = None) -> None:
    """The entry point of a LocalCluster task (stdin: one JSON line of configuration); ``parent``:
    the pid of the process that started it."""
    die_with_parent(parent)
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)     # the parent died before it told us anything
        line += chunk
    cfg = json.loads(line)
    watch_parent(parent)
    clean_up_on_sigterm()
    if cfg.get("stack_file"):     # before it is ready: the signal would end a process without the handler
        register_stack_dump(cfg["stack_file"])
    for entry in cfg.get("sys_path", ()):   # import what the parent can import (its sys.path edits too)
        if entry not in sys.path:
            sys.path.append(entry)
    _logging()
    from . import events, server as server_mod
    from .liveness import Heartbeat

    key = bytes.fromhex(cfg["key"])
    srv = server_mod.Server(cfg.get("spec"), cfg["job"], cfg["index"], key=key, bind=cfg.get("bind"),
                            port=cfg.get("port", 0), port_tries=cfg.get("port_tries", 1), start=False)
    try:
        srv.listen()
    except server_mod.ClusterError:
        if not cfg.get("port_fallback"):
            raise
        srv._port, srv._port_tries = 0, 1    # a restart whose old port is taken: any free port
        srv.listen()
    server_mod._process_server = srv
    events.default_log().task, events.default_log().rank = srv.name, srv.task_index
    mon = cfg["monitor"]
    hb = Heartbeat(srv.transport, key, mon["address"], mon["id"], srv.name,
                   {"address": srv.address, "pid": srv.pid, "id": srv.id}, cfg.get("heartbeat", 0.25)).start()
    print(f"flowlab worker {srv.name} (pid {srv.pid}) listening on {srv.address}", file=sys.stderr, flush=True)
    if cfg.get("preload"):
        threading.Thread(target=_preload, args=(cfg["preload"],), daemon=True).start()
    threading.Thread(target=_sweep, name="flowlab-sweep", daemon=True).start()
    try:
        srv.serve_exec()    # user code on this (main) thread, so a client's cancel can interrupt it
    finally:
        hb.stop()
    print(f"flowlab worker {srv.name}: shut down", file=sys.stderr, flush=True)


def serve_task(spec, job: str, index: int, key: bytes, bind: str | None = None) -> int:
    """Run one task of ``spec`` in this process until it is shut down or interrupted."""
    _logging()
    from . import events, server as server_mod

    srv = server_mod.Server(spec, job, index, key=key, bind=bind, start=False)
    srv.listen()
    server_mod._process_server = srv
    events.default_log().task, events.default_log().rank = srv.name, srv.task_index
    print(f"flowlab worker {srv.name} (pid {srv.pid}) listening on {srv.address}; target {srv.target}",
          file=sys.stderr, flush=True)
    srv.start()
    try:
        while not srv.join(0.5):
            pass
    except KeyboardInterrupt:
        print(f"flowlab worker {srv.name}: interrupted, shutting down", file=sys.stderr, flush=True)
        srv.stop()
        srv.join(2)
    return 0
