#!/usr/bin/env python
"""Cluster benchmark: flowlab's LocalCluster beside Dask's LocalCluster and ipyparallel, in one process.

    python bench/cluster.py            # full run, about a minute (more with Dask and ipyparallel)
    python bench/cluster.py --quick    # smoke run, a few seconds; rough numbers

Three questions, each asked of every system that is installed (Dask: ``distributed``;
ipyparallel), one system at a time (its cluster started, measured, closed):

1. How long until N workers are ready (the constructor returns and a first task could run)?
2. How long is the round trip of a tiny remote operation? Rows: a bare pyzmq DEALER/ROUTER echo
   between two processes (the floor any pyzmq transport stands on), flowlab's signed ``ping``,
   a tiny **op** (an inline handler adding two float32[4] arrays sent as raw buffers: the shape
   remote eager ops have), a tiny **eager op** as users write it (``x + x`` under
   ``fl.device("/job:worker/task:0")``, then ``.numpy()``: two round trips, ``op`` and ``fetch``,
   both run on the worker's loop thread since the op is small), and a tiny **task** (a Python
   function, pickled by value, run on the worker's execution thread), beside Dask's
   ``submit(...).result()`` and ipyparallel's ``apply_sync``. The lane each client connection took
   (``unix``: the local lane; ``tcp``) is printed with the figures; ``FLOWLAB_LOCAL_LANE=0``
   measures TCP instead, ``FLOWLAB_LANE_SPIN_US=200`` the local lane with a short spin before
   sleeping (off by default; see flowlab/cluster/unix.py). The load average is printed beside the
   figures.
3. How fast do 64 MiB move from one worker to another (flowlab: ``push``; Dask: a task on worker B
   that needs a 64 MiB result held by worker A)? The floor: bare pyzmq sending 64 MiB to another
   process and waiting for its receipt. One untimed warm-up transfer comes first.

Round trips: the minimum over rounds of the mean time per call in a sample of about 0.2 s
(0.02 s with --quick), and the median of those samples; start times and transfers: the median.
The exit status is 0 whatever the figures are. See bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import flowlab  # noqa: E402
import flowlab.cluster as fc  # noqa: E402

MODES = {
    "full": dict(starts=5, rounds=7, sample=0.2, transfers=5),
    "quick": dict(starts=1, rounds=2, sample=0.02, transfers=1),
}
MIB64 = 64 << 20
TARGETS = [  # (label, key in results, limit, unit)
    ("4 workers ready in under 1.0 s", ("ready", "flowlab"), 1.0, "s"),
    ("tiny remote op round trip under 150 us", ("rt", "flowlab op"), 150e-6, "us"),
    ("64 MiB between two workers at 1 GB/s or more", ("gbps", "flowlab"), 1.0, "GB/s"),
]

_ECHO = """
import sys, zmq
s = zmq.Context().socket(zmq.ROUTER); s.linger = 0
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    m = s.recv_multipart(copy=False)
    if len(m) == 2 and m[1].bytes == b"stop":
        break
    if len(m[-1]) > 1 << 20:       # a big buffer: answer with a receipt, as a push does
        m = [m[0], b"ok"]
    s.send_multipart(m, copy=False)
"""


def say(*a):
    print(*a, flush=True)


# -- timing helpers ------------------------------------------------------------------------------
def round_trip(fn, mode) -> tuple[float, float]:
    """(min, median) over rounds of the mean seconds per call of ``fn``."""
    fn()
    n, t0 = 1, time.perf_counter()
    while True:   # calibrate a sample to about mode["sample"] seconds
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        el = time.perf_counter() - t0
        if el >= mode["sample"] / 4 or n >= 1 << 16:
            break
        n *= 2
    n = max(1, round(n * mode["sample"] / max(el, 1e-9)))
    means = []
    for _ in range(mode["rounds"]):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        means.append((time.perf_counter() - t0) / n)
    return min(means), statistics.median(means)


def bare_zmq(mode, results):
    """The floors: a small echo round trip, and 64 MiB sent to another process with a receipt."""
    import zmq
    child = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.linger = 0
        s.connect(f"tcp://127.0.0.1:{port}")
        msg = [b"x" * 180]

        def once():
            s.send_multipart(msg)
            s.recv_multipart()
        results["rt"]["bare pyzmq echo"] = round_trip(once, mode)
        big = np.ones(MIB64 // 4, np.float32)
        times = []
        for _ in range(mode["transfers"] + 1):   # the first one (buffers, page faults) is not counted
            t0 = time.perf_counter()
            s.send_multipart([b"h", big], copy=False)
            s.recv_multipart()
            times.append(time.perf_counter() - t0)
        results["xfer"]["bare pyzmq"] = statistics.median(times[1:])
        s.send_multipart([b"stop"])
        s.close(0)
    finally:
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


# -- flowlab -----------------------------------------------------------------------------------------
def _install_add_op():
    """Runs on each worker: an inline handler for message type "bench_add" (a tiny remote op)."""
    from flowlab.cluster.server import Reply, current_server

    def add(server, msg):
        a, b = msg.buffers
        return Reply({}, [a + b])
    current_server().register("bench_add", add)


def bench_flowlab(workers, mode, results):
    import flowlab.cluster.local  # noqa: F401 - imports (zmq...) are not part of the start time
    import flowlab.cluster.transport  # noqa: F401

    starts = []
    for _ in range(mode["starts"]):
        t0 = time.perf_counter()
        c = fc.LocalCluster(workers=workers)
        starts.append(time.perf_counter() - t0)
        if len(starts) < mode["starts"]:
            c.close()
    results["ready"]["flowlab"] = statistics.median(starts)
    try:
        client, w0 = c.client, c.workers[0]
        results["rt"]["flowlab ping"] = round_trip(lambda: client.request(w0, "ping"), mode)
        c.run(_install_add_op)
        a = np.ones(4, np.float32)
        results["rt"]["flowlab op"] = round_trip(lambda: client.request(w0, "bench_add", None, [a, a]), mode)
        check = client.request(w0, "bench_add", None, [a, a]).buffers[0]
        assert check.tolist() == [2.0] * 4, check

        x = flowlab.constant(a)

        def eager():
            with flowlab.device(w0):
                y = x + x
            return y.numpy()
        assert eager().tolist() == [2.0] * 4
        results["rt"]["flowlab eager op"] = round_trip(eager, mode)

        def tiny():
            return 1
        results["rt"]["flowlab task"] = round_trip(lambda: c.call(w0, tiny), mode)
        lanes = set(client.stats["lanes"].values())
        peer_lane = {}
        if workers >= 2:
            big = np.ones(MIB64 // 4, np.float32)
            client.request(w0, "put", {"key": "big"}, [big])
            client.request(w0, "push", {"key": "big", "to": c.workers[1]})   # warm-up: connection, numpy
            times = []
            for _ in range(mode["transfers"]):
                t0 = time.perf_counter()
                client.request(w0, "push", {"key": "big", "to": c.workers[1]})
                times.append(time.perf_counter() - t0)
            ok = c.call(1, lambda: float(fc.current_server().store.get("big").sum()))
            assert ok == MIB64 // 4, ok
            results["xfer"]["flowlab"] = statistics.median(times)
            peer_lane = c.call(0, lambda: fc.current_server().peers().stats["lanes"])
        results["lanes"] = {"client": sorted(lanes), "worker to worker": sorted(set(peer_lane.values()))}
    finally:
        c.close()


# -- Dask ----------------------------------------------------------------------------------------------
def _dask_make(n):
    return np.ones(n // 4, np.float32)


def _dask_nbytes(x):
    return x.nbytes


def bench_dask(workers, mode, results):
    try:
        import distributed
    except ImportError:
        return "not installed (pip install 'dask[distributed]')"
    import logging
    logging.getLogger("distributed").setLevel(logging.ERROR)
    starts = []
    for _ in range(mode["starts"]):
        t0 = time.perf_counter()
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        client.wait_for_workers(workers)
        starts.append(time.perf_counter() - t0)
        if len(starts) < mode["starts"]:
            client.close()
            cluster.close()
    results["ready"]["dask"] = statistics.median(starts)
    try:
        addrs = sorted(client.scheduler_info()["workers"])

        def tiny():
            return 1
        results["rt"]["dask task"] = round_trip(
            lambda: client.submit(tiny, pure=False, workers=addrs[:1]).result(), mode)
        if workers >= 2:
            times = []
            for _ in range(mode["transfers"] + 1):   # the first one is a warm-up
                fut = client.submit(_dask_make, MIB64, pure=False, workers=addrs[:1])
                distributed.wait(fut)
                t0 = time.perf_counter()
                n = client.submit(_dask_nbytes, fut, pure=False, workers=addrs[1:2], allow_other_workers=False).result()
                times.append(time.perf_counter() - t0)
                assert n == MIB64
                del fut
            results["xfer"]["dask"] = statistics.median(times[1:])
    finally:
        client.close()
        cluster.close()
    return distributed.__version__


# -- ipyparallel -----------------------------------------------------------------------------------------
def bench_ipyparallel(workers, mode, results):
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="flowlab-bench-ipython-"))
    try:
        import ipyparallel as ipp
    except ImportError:
        return "not installed (pip install ipyparallel)"
    starts = []
    for _ in range(mode["starts"]):
        t0 = time.perf_counter()
        cluster = ipp.Cluster(n=workers, log_level=40)
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(workers, timeout=120)
        starts.append(time.perf_counter() - t0)
        if len(starts) < mode["starts"]:
            rc.close()
            cluster.stop_cluster_sync()
    results["ready"]["ipyparallel"] = statistics.median(starts)
    try:
        view = rc[0]

        def tiny():
            return 1
        results["rt"]["ipyparallel task"] = round_trip(lambda: view.apply_sync(tiny), mode)
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return ipp.__version__


# -- report --------------------------------------------------------------------------------------------
def report(results, versions, workers):
    say()
    say(f"1. Time to {workers} ready workers (median of starts)")
    rows = [[name, f"{t:.3f} s"] for name, t in results["ready"].items()]
    for line in C.table(["system", "ready"], rows):
        say("   " + line)
    say()
    lanes = results.get("lanes") or {}
    say("2. Round trip of a tiny remote operation (one worker; microseconds per call); flowlab lanes: "
        + ", ".join(f"{k} {'+'.join(v) or '-'}" for k, v in lanes.items()))
    rows = [[name, C.fmt_us(best), C.fmt_us(med)] for name, (best, med) in results["rt"].items()]
    for line in C.table(["row", "best", "median"], rows):
        say("   " + line)
    say()
    say("3. 64 MiB from one worker to another (median)")
    rows = []
    for name, t in results["xfer"].items():
        gbps = MIB64 / t / 1e9
        results["gbps"][name] = gbps
        rows.append([name, f"{t * 1e3:.1f} ms", f"{gbps:.2f} GB/s"])
    for line in C.table(["system", "time", "rate"], rows):
        say("   " + line)
    for name, why in versions.items():
        if why and why.startswith("not installed"):
            say(f"   {name}: {why}")
    say()
    say("4. Targets")
    rows = []
    for label, (part, key), limit, unit in TARGETS:
        value = results[part].get(key)
        if isinstance(value, tuple):
            value = value[0]
        if value is None:
            shown, verdict = "n/a", "n/a"
        else:
            ok = value >= limit if unit == "GB/s" else value < limit
            shown = f"{value * 1e6:.1f} us" if unit == "us" else f"{value:.2f} {unit}" if unit != "s" else f"{value:.3f} s"
            verdict = "PASS" if ok else "MISS"
        rows.append([label, shown, verdict])
    for line in C.table(["target", "measured", ""], rows):
        say("   " + line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: one start, short samples")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--no-peers", action="store_true", help="skip Dask and ipyparallel even when installed")
    ap.add_argument("--json", metavar="PATH", help="also write the raw figures (seconds) as JSON")
    args = ap.parse_args(argv)
    mode = MODES["quick" if args.quick else "full"]
    import zmq
    say(f"machine : {C.cpu_model()}; {C.usable_cores()} usable cores (os.cpu_count() = {os.cpu_count()})")
    say(f"python  : {sys.version.split()[0]}; numpy {np.__version__}; pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()})")
    say(f"flowlab : {flowlab.__version__}")
    try:
        load = os.getloadavg()[0]
        busy = "; other processes compete for the cores, so timings are noisy" if load > 0.5 * C.usable_cores() else ""
        say(f"load    : {load:.2f} (1-minute load average){busy}")
    except OSError:
        pass
    results = {"ready": {}, "rt": {}, "xfer": {}, "gbps": {}, "lanes": {}}
    bare_zmq(mode, results)
    say("flowlab : measuring")
    bench_flowlab(args.workers, mode, results)
    versions = {}
    if args.no_peers:
        versions = {"dask": "not installed (skipped: --no-peers)", "ipyparallel": "not installed (skipped: --no-peers)"}
    else:
        for name, fn in (("dask", bench_dask), ("ipyparallel", bench_ipyparallel)):
            say(f"{name:<8}: measuring")
            try:
                versions[name] = fn(args.workers, mode, results)
            except Exception as e:   # a peer failing must not hide flowlab's figures
                versions[name] = f"failed: {type(e).__name__}: {e}"
                say(f"{name}: failed: {type(e).__name__}: {e}")
    say("peers   : " + "; ".join(f"{k} {v}" for k, v in versions.items()))
    report(results, versions, args.workers)
    try:
        say(f"\nload    : {os.getloadavg()[0]:.2f} at the end (1-minute load average)")
    except OSError:
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**results, "versions": versions}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
