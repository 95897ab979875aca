"""A task's process: what runs in each worker of a LocalCluster, and behind ``flowlab worker``.

A LocalCluster starts each task as ``python -c BOOT`` (see :func:`command`): the bootstrap imports
this module without running ``flowlab/__init__`` (which loads numpy and the whole engine), so a
worker is ready in about the time of a bare interpreter plus pyzmq; flowlab's engine and numpy
load in the worker when code first uses them (``fl.constant``: the first attribute looked up on
the ``flowlab`` package runs its ``__init__``). The parent writes the task's configuration, key included, as
one JSON line on the child's stdin (so the key is never on a command line or in the environment)
and keeps the pipe open. The child:

1. reads that line, then watches stdin on a thread: end of file means the parent is gone
   (closed the cluster, restarted, crashed, was killed), and the worker exits at once, so nothing
   is orphaned. It runs in a session of its own, so the notebook's Interrupt button (SIGINT to
   the kernel's process group) does not reach it: instead the interrupted client sends a signed
   ``cancel`` (see :mod:`.server`), which interrupts the user's code on this process's main thread;
2. binds its port, starts its heartbeat (which first says ``ready`` with its address), and serves:
   the message loop on a thread, user code (``run``) on the main thread.

``flowlab worker --cluster spec.json --job worker --task 1`` runs one task from a shell instead
(:func:`serve_task`), with the key from ``FLOWLAB_CLUSTER_KEY`` or a key file.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading

__all__ = ["command", "child_main", "serve_task"]

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
flowlab.cluster.worker.child_main()
"""


def command(python: str | None = None) -> list[str]:
    """The argv that starts a LocalCluster task: this interpreter and the light bootstrap."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [python or sys.executable, "-c", _BOOT.format(pkg=pkg, init=os.path.join(pkg, "__init__.py"))]


def _watch_parent():
    def watch():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        print("flowlab worker: stdin closed (the process that started this worker is gone); exiting",
              file=sys.stderr, flush=True)
        _remove_lane()
        os._exit(0)
    threading.Thread(target=watch, name="flowlab-parent-watch", daemon=True).start()


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


def child_main() -> None:
    """The entry point of a LocalCluster task (stdin: one JSON line of configuration)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)     # the parent died before it told us anything
        line += chunk
    cfg = json.loads(line)
    _watch_parent()
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
