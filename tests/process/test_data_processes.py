"""map(..., use_processes=True): the calls really run in worker processes, results keep their order,
errors come back with the element's index and the child's traceback, unusable functions are refused
with a reason, and no worker process outlives its map, whether it ends, fails, is closed, dropped,
loses a worker, or loses its parent."""
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import flowlab as fl

pytestmark = [pytest.mark.process, pytest.mark.timeout(180)]
Dataset = fl.data.Dataset
HERE = Path(__file__).resolve().parent


# -- functions the worker processes import by name (from this module) ---------------------------------
def python_heavy(x):
    total = 0
    for i in range(2000):          # pure Python: holds the GIL, the case processes are for
        total += i % 7
    return x * 2 + total - total


def pid_of_worker(x):
    return os.getpid()


def fails_at_five(x):
    if int(x) == 5:
        raise ValueError(f"five is not allowed (got {int(x)})")
    return x


class Unpicklable(Exception):
    def __init__(self, lock):
        super().__init__("an exception holding a lock")
        self.lock = lock

    def __reduce__(self):
        raise TypeError("no pickling of this one")


def raises_unpicklable(x):
    raise Unpicklable(threading.Lock())


class LockHolder:
    """A callable whose state cannot travel to another process."""

    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, x):
        return x


def sleeps_long(x):
    time.sleep(60)
    return x


def slow_pid(x):
    time.sleep(0.02)
    return os.getpid()


def pair(a, b):
    return {"sum": a + b, "pid": os.getpid()}


# -- helpers -----------------------------------------------------------------------------------------
def state_of(pid):
    """'gone', 'zombie' or 'running' (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    return "zombie" if state == "Z" else "running"


def wait_until_gone(pids, timeout=15.0, zombie_ok=False):
    deadline = time.monotonic() + timeout
    ok = {"gone", "zombie"} if zombie_ok else {"gone"}
    while time.monotonic() < deadline:
        if all(state_of(p) in ok for p in pids):
            return
        time.sleep(0.05)
    assert False, f"worker processes left behind: {[(p, state_of(p)) for p in pids if state_of(p) not in ok]}"


@pytest.fixture(autouse=True)
def no_children_before_or_after():
    assert not multiprocessing.active_children()
    yield
    deadline = time.monotonic() + 15
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = multiprocessing.active_children()
    for child in left:               # only processes this test started: clean up, then fail
        child.kill()
        child.join()
    assert not left, f"worker processes left behind: {left}"


# -- results -------------------------------------------------------------------------------------------
def test_results_match_the_thread_map_and_keep_their_order():
    ds = Dataset.range(40)
    reference = [int(x) for x in ds.map(python_heavy)]
    procs = ds.map(python_heavy, num_parallel_calls=2, use_processes=True)
    assert [int(x) for x in procs] == reference == [2 * i for i in range(40)]
    unordered = ds.map(python_heavy, num_parallel_calls=2, use_processes=True, deterministic=False)
    assert sorted(int(x) for x in unordered) == reference
    zipped = Dataset.zip(Dataset.range(6), Dataset.range(10, 16)).map(pair, num_parallel_calls=2, use_processes=True)
    out = list(zipped)
    assert [int(e["sum"]) for e in out] == [10 + 2 * i for i in range(6)]
    assert isinstance(out[0]["sum"], fl.Tensor) and out[0]["sum"].dtype == fl.int64


def test_calls_run_in_k_worker_processes_named_in_stats():
    ds = Dataset.range(30).map(slow_pid, num_parallel_calls=2, use_processes=True)
    pids = {int(x) for x in ds}
    assert os.getpid() not in pids and len(pids) <= 2
    stage = ds.stats().stage("map#1")
    assert pids <= set(stage.pids) and len(stage.pids) == 2 and stage.parallelism == 2
    wait_until_gone(stage.pids, timeout=5)


def test_autotune_adds_worker_processes():
    options = fl.data.Options()
    options.autotune.cpu_budget = 3
    ds = Dataset.range(80).map(slow_pid, num_parallel_calls=fl.data.AUTOTUNE, use_processes=True)
    ds = ds.with_options(options)
    pids = {int(x) for x in ds}
    stage = ds.stats().stage("map#1")
    assert 1 < stage.parallelism <= 3 and len(stage.pids) == stage.parallelism
    assert pids <= set(stage.pids)
    wait_until_gone(stage.pids)


# -- errors ------------------------------------------------------------------------------------------------
def test_an_error_in_a_worker_names_the_element_and_carries_its_traceback():
    ds = Dataset.range(10).map(fails_at_five, num_parallel_calls=2, use_processes=True)
    got = []
    with pytest.raises(fl.data.PipelineError) as info:
        for x in ds:
            got.append(int(x))
    assert got == [0, 1, 2, 3, 4]
    err = info.value
    assert err.index == 5 and err.stage == "map"
    assert isinstance(err.__cause__, ValueError) and "five is not allowed (got 5)" in str(err.__cause__)
    message = str(err)
    assert "in worker process pid" in message and 'raise ValueError(f"five is not allowed' in message
    wait_until_gone(ds.stats().stage("map#1").pids)


def test_an_exception_that_cannot_travel_arrives_as_its_text():
    with pytest.raises(fl.data.PipelineError) as info:
        list(Dataset.range(3).map(raises_unpicklable, num_parallel_calls=1, use_processes=True))
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "Unpicklable: an exception holding a lock" in str(info.value)


def test_functions_that_cannot_be_sent_are_refused_with_the_reason():
    ds = Dataset.range(3)
    with pytest.raises(TypeError, match=r"a lambda cannot be sent to worker processes.*top level of a \.py module"):
        ds.map(lambda x: x, num_parallel_calls=2, use_processes=True)

    def local(x):
        return x
    with pytest.raises(TypeError, match="local is defined inside another function"):
        ds.map(local, num_parallel_calls=2, use_processes=True)

    with pytest.raises(TypeError, match=r"LockHolder cannot be pickled .*cannot pickle '_thread.lock' object"):
        ds.map(LockHolder(), num_parallel_calls=2, use_processes=True)
    with pytest.raises(ValueError, match="use_processes=True needs num_parallel_calls"):
        ds.map(python_heavy, use_processes=True)
    assert not multiprocessing.active_children()      # refused before any process started


def test_a_killed_worker_is_reported_and_the_others_are_stopped():
    it = iter(Dataset.range(100).map(slow_pid, num_parallel_calls=2, use_processes=True))
    first = int(next(it))
    pids = it.stats().stage("map#1").pids
    os.kill(first, signal.SIGKILL)                   # a worker this test's pipeline started
    with pytest.raises(fl.data.PipelineError, match=rf"worker process pid {first} was killed by signal 9"):
        for _ in it:
            pass
    wait_until_gone(pids)


# -- cleanup, by pid -------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["exhausted", "closed", "broken out of", "dropped", "failed"])
def test_no_worker_process_outlives_its_map(how):
    fn = fails_at_five if how == "failed" else slow_pid
    ds = Dataset.range(10 if how == "exhausted" else 1000).map(fn, num_parallel_calls=2, use_processes=True)
    it = iter(ds)
    stats = it.stats()
    if how == "exhausted":
        assert len(list(it)) == 10
    elif how == "closed":
        next(it)
        it.close()
    elif how == "broken out of":
        for _ in ds:
            break
        stats = ds.stats()
        it.close()
    elif how == "dropped":
        next(it)
        del it
        gc.collect()
    else:
        with pytest.raises(fl.data.PipelineError):
            list(it)
    pids = stats.stage("map#1").pids
    assert len(pids) == 2
    wait_until_gone(pids)


def test_close_stops_workers_in_the_middle_of_a_long_call():
    it = iter(Dataset.range(4).map(sleeps_long, num_parallel_calls=2, use_processes=True))
    threading.Timer(1.5, it.close).start()           # next() would wait a minute; close() from another thread
    pids = it.stats().stage("map#1").pids
    with pytest.raises((StopIteration, fl.data.PipelineError)):
        next(it)
    it.close()
    wait_until_gone(pids)


def test_workers_exit_when_their_parent_dies(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(HERE)!r})
        import flowlab as fl
        from test_data_processes import sleeps_long

        if __name__ == "__main__":
            it = iter(fl.data.Dataset.range(4).map(sleeps_long, num_parallel_calls=2, use_processes=True))
            stage = it.stats().stage("map#1")
            while len(stage.pids) < 2:
                time.sleep(0.05)
            print(" ".join(map(str, stage.pids)), flush=True)
            next(it)           # blocks: every worker is inside a 60 s call
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip(), parent.stderr.read()
        pids = [int(p) for p in line.split()]
        time.sleep(1.0)                              # let the workers start their long calls
        assert all(state_of(p) == "running" for p in pids)
        parent.kill()                                # the parent dies without any cleanup of its own
        parent.wait(30)
        wait_until_gone(pids, zombie_ok=True)        # orphans are reaped by whoever adopts them
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        parent.stdout.close()
        parent.stderr.close()
