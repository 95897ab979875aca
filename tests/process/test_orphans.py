"""Nothing outlives its starter: a LocalCluster whose parent is SIGKILLed ends every worker (a
SIGSTOPped one too, and while a process forked after the cluster keeps the workers' stdin open),
and what such a run leaves (its ``flowlab-cluster-*`` folder, lane sockets, /dev/shm segments) is
removed by the next flowlab process; a failed native allreduce and a half-formed group leave no
segment behind, and no sweep ever removes what a live process owns."""
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

import flowlab as fl
from _processes import gone, kill_left, wait_gone
from flowlab.cluster import leftovers
from flowlab.cluster.collectives import shm

pytestmark = pytest.mark.process

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The parent: a LocalCluster of two workers, worker 1 frozen (SIGSTOP) when asked, a forked child
# that holds the workers' stdin pipes when asked; it prints what it made and waits to be killed
# (at most 60 s: it never outlives the test by much).
_PARENT = r"""
import json, os, signal, sys, time
sys.path.insert(0, {repo!r})
import flowlab as fl
from flowlab.cluster import unix
stop, fork = {stop!r}, {fork!r}
c = fl.cluster.LocalCluster(workers=2)
c.run(lambda: 0)
pids = [c.pid(t) for t in c.tasks]
if stop:
    c.kill(1, signal.SIGSTOP)
child = None
if fork:
    child = os.fork()
    if child == 0:            # holds every fd the parent had: the pipes to the workers' stdin
        time.sleep(60)
        os._exit(0)
lanes = [unix.lane_path(*a.rsplit(":", 1)) for a in c.spec.as_dict()["worker"]]
print(json.dumps({{"workers": pids, "child": child, "folder": c._res.tmpdir, "lanes": lanes}}), flush=True)
time.sleep(60)
"""


def _start_parent(stop=False, fork=False):
    code = _PARENT.format(repo=_REPO, stop=stop, fork=fork)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"the parent did not start its cluster:\n{err.decode()[-3000:]}")
    return proc, json.loads(line)


def _kill_parent(proc, made):
    proc.kill()                          # SIGKILL: no exit handler runs in the parent
    proc.wait(10)
    left = wait_gone(made["workers"], 5.0)
    return left


def _cleanup(proc, made):
    pids = list(made["workers"]) + ([made["child"]] if made.get("child") else [])
    for pid in made["workers"]:          # a stopped leftover must be able to die of SIGKILL anyway
        if not gone(pid):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    kill_left(pids + [proc.pid])
    if proc.poll() is None:
        proc.wait(5)


def _wait_true(check, limit=10.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_killed_parent_ends_every_worker_even_a_stopped_one_and_its_files_are_swept(make_cluster):
    proc, made = _start_parent(stop=True)
    try:
        left = _kill_parent(proc, made)
        assert left == [], f"workers {left} outlived their parent (worker 1 was SIGSTOPped)"
        make_cluster(workers=1)                       # the next flowlab process sweeps what it left
        assert _wait_true(lambda: not os.path.exists(made["folder"])), \
            f"{made['folder']} of a killed parent is still there"
        lanes = [p for p in made["lanes"] if p]
        assert _wait_true(lambda: not any(os.path.exists(p) for p in lanes)), \
            f"lane sockets of a killed run are still there: {[p for p in lanes if os.path.exists(p)]}"
    finally:
        _cleanup(proc, made)


def test_workers_do_not_live_on_while_a_forked_child_holds_their_stdin():
    proc, made = _start_parent(fork=True)
    try:
        assert made["child"] and not gone(made["child"])
        left = _kill_parent(proc, made)
        assert left == [], f"workers {left} live on while the parent's forked child {made['child']} runs"
    finally:
        _cleanup(proc, made)


def _left_by(pids):
    return sorted(f for f in os.listdir(shm.SHM_DIR) for p in pids if f.startswith(f"flowlab-{p}-"))


def _late_native():
    import time

    import numpy as np

    import flowlab as fl

    fl.cluster.allreduce(np.ones(4, np.float32), algorithm="native", timeout=30)   # the group forms
    if fl.cluster.rank() == 1:
        time.sleep(2.5)                  # past rank 0's deadline
    try:
        fl.cluster.allreduce(np.ones(1 << 18, np.float32), algorithm="native", timeout=1.0)   # 1 MiB: windows
        return "ok", os.getpid()
    except fl.cluster.CollectiveError as e:
        return type(e).__name__, os.getpid()


def test_a_failed_native_allreduce_leaves_no_window():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        cluster.run(lambda: 0)
        got = cluster.run(_late_native, timeout=60)
        pids = [pid for _, pid in got]
        assert [what for what, _ in got] != ["ok", "ok"], got      # the late rank must have made it fail
        assert _left_by(pids) == [], "a failed native allreduce left its windows in /dev/shm"
        assert cluster.run(_small_native, timeout=60) == [3.0, 3.0]   # and the next call works
    assert _left_by(pids) == []


def _small_native():
    import numpy as np

    import flowlab as fl
    return float(fl.cluster.allreduce(np.full(1 << 18, fl.cluster.rank() + 1, np.float32),
                                      algorithm="native", timeout=30)[0])


def _half_formed_ring():
    """What a worker holds when its peer was killed as the group formed: a ring made for the peer
    (the greeting handler's ``Inbound``) that nobody mapped, so its name is still in /dev/shm."""
    from flowlab.cluster.collectives import shm

    ring = shm.Inbound(1, shm.poke_socket())
    globals()["_kept"] = ring           # the communicator would keep it
    return os.getpid(), ring.name


def test_a_ring_nobody_mapped_goes_when_its_maker_closes_or_is_killed():
    with fl.cluster.LocalCluster(workers=2) as cluster:
        pid, name = cluster.call(0, _half_formed_ring)
        assert os.path.exists(shm.segment_path(name))
        pid2, name2 = cluster.call(1, _half_formed_ring)
        cluster.kill(1)                                  # SIGKILL: it cannot clean up
        assert wait_gone([pid2], 5.0) == []
        assert os.path.exists(shm.segment_path(name2))
    # closed: worker 0 ended on its own (stdin closed) and unlinked what it made
    assert not os.path.exists(shm.segment_path(name)), f"{name} of a closed cluster's worker is still there"
    assert name2 in leftovers.sweep_segments(shm.SHM_DIR)    # the killed one's, by the next sweep
    assert not os.path.exists(shm.segment_path(name2))


def test_a_sweep_removes_only_what_dead_owners_left(tmp_path):
    token = secrets.token_hex(6)
    mine = shm.segment_path(f"flowlab-{leftovers.owner_tag()}-r{token}")       # this live process's
    done = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n"
                           "from flowlab.cluster import leftovers; print(leftovers.owner_tag())" % _REPO],
                          capture_output=True, text=True, timeout=60, check=True)
    dead_tag = done.stdout.strip()
    dead = shm.segment_path(f"flowlab-{dead_tag}-w{token}")                     # an exited process's
    pid, start, ns = dead_tag.split("-")
    reused = shm.segment_path(f"flowlab-{os.getpid()}-{int(start) + 1}-{ns}-r{token}")   # this pid, another start
    foreign = shm.segment_path(f"flowlab-{pid}-{start}-{int(ns) + 1}-r{token}")        # another pid namespace
    paths = [mine, dead, reused, foreign]
    try:
        for p in paths:
            with open(p, "wb") as f:
                f.write(b"x")
        folder = tmp_path / f"{leftovers.FOLDER_PREFIX}{dead_tag}-abc"
        live_folder = tmp_path / f"{leftovers.folder_prefix()}abc"
        folder.mkdir()
        live_folder.mkdir()
        removed = leftovers.sweep_segments(shm.SHM_DIR)
        assert os.path.basename(dead) in removed and os.path.basename(reused) in removed
        assert os.path.exists(mine) and os.path.exists(foreign)
        assert leftovers.sweep_folders(str(tmp_path)) == [folder.name]
        assert live_folder.exists()
    finally:
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def test_workers_started_from_a_thread_that_ends_live_on(make_cluster):
    """The parent-death signal fires when the *thread* that forked a worker ends: workers are
    started from a thread that lives as long as the process, not from the caller's."""
    import threading

    made = []
    t = threading.Thread(target=lambda: made.append(make_cluster(workers=1)))
    t.start()
    t.join(60)
    assert made, "the cluster did not start"
    cluster = made[0]
    pid = cluster.pid(0)
    time.sleep(1.0)                       # the starting thread is long gone
    assert not gone(pid), "the worker died with the thread that started its cluster"
    assert cluster.run(os.getpid) == [pid]
