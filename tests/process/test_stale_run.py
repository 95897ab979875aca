"""A ``run`` stopped because its task went silent must not run there later (found by test_soak.py).

A call on every worker fails as soon as the liveness monitor says one of them is unresponsive (a
SIGSTOP the cluster did not send, a starved process) or paused. The rest of the call is cancelled
on the other workers; the silent one's own request used to get no cancel at all. Its ``run`` sat
in its socket (or stood frozen inside the collective), and when the task ran again it went on with
it: after a restart of another worker had regrouped everyone, the stale job's allreduce became
collective #1 of the new group and met the next caller's #1 (``CollectiveMismatchError``), or held
the task so that the next ``run`` queued behind it until its deadline. Now the silent task gets a
cancel too, in order behind the request it stops, so it reads it before it would run that request.
"""
import os
import signal
import time

import pytest

pytestmark = pytest.mark.process


def _tagged_sum(step, n, timeout, mark, tag, pause_first=0.0):
    """Append ``tag`` to ``mark`` (a file), then allreduce ``rank + step`` over ``n`` elements."""
    import time

    import numpy as np

    import flowlab.cluster as cl
    with open(mark, "a") as f:
        f.write(f"{cl.rank()} {tag} start\n")
    if pause_first and cl.rank() != 0:
        time.sleep(pause_first)
    out = cl.allreduce(np.full(n, float(cl.rank() + step)), timeout=timeout)
    with open(mark, "a") as f:
        f.write(f"{cl.rank()} {tag} end\n")
    return float(out.min()), float(out.max())


def _wait_status(c, task, want, within=15.0):
    end = time.monotonic() + within
    while c.status(task) != want:
        assert time.monotonic() < end, f"{c.workers[task]} is {c.status(task)}, not {want}, after {within} s"
        time.sleep(0.02)


def _lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _storm_then_check(c, mark, queued, restart=True):
    """Freeze worker 0 from outside the cluster with a run either queued in its socket
    (``queued``) or already inside the allreduce; fail that call, kill and restart worker 1
    (``restart``), wake worker 0; the next allreduce must work at once."""
    from flowlab.cluster.errors import ClusterError

    frozen = c.pid(0)
    if queued:
        os.kill(frozen, signal.SIGSTOP)
        _wait_status(c, 0, "unresponsive")
        with pytest.raises(ClusterError):
            c.run(_tagged_sum, 0, 200_000, 30.0, mark, "stale", timeout=20)
    else:
        # ranks 1 and 2 sleep first: rank 0 is inside the allreduce, waiting, when it is frozen
        pending = [c.client.submit(t, "run", None, _run_frames(_tagged_sum, 0, 200_000, 30.0, mark, "stale", 3.0))
                   for t in c.workers]
        end = time.monotonic() + 10
        while "0 stale start" not in _lines(mark):
            assert time.monotonic() < end, "rank 0 never started the job"
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(frozen, signal.SIGSTOP)
        with pytest.raises(ClusterError):
            c.client.results(pending, timeout=20)
    try:
        if restart:
            c.kill(1)
            _wait_status(c, 1, "dead")
            c.restart(1)
    finally:
        os.kill(frozen, signal.SIGCONT)
    _wait_status(c, 0, "alive")
    t0 = time.monotonic()
    got = c.run(_tagged_sum, 1, 4096, 8.0, mark, "check", timeout=15)   # the first try must work
    took = time.monotonic() - t0
    assert got == [(6.0, 6.0)] * 3
    assert took < 6.0, f"the check took {took:.1f} s: it waited behind the stale job"
    time.sleep(0.5)
    stale = [ln for ln in _lines(mark) if ln.startswith("0 stale")]
    return stale


def _run_frames(fn, *args):
    from flowlab.cluster.protocol import dumps
    return [dumps(fn), dumps((args, {}))]


def test_a_run_queued_on_a_silent_worker_never_starts(make_cluster, tmp_path):
    c = make_cluster(workers=3, unresponsive_after=0.5)
    mark = str(tmp_path / "mark")
    assert c.run(_tagged_sum, 0, 8, 10.0, mark, "form", timeout=20) == [(3.0, 3.0)] * 3
    stale = _storm_then_check(c, mark, queued=True)
    assert stale == [], f"worker 0 ran the job that was stopped while it was silent: {stale}"
    assert c.run(_tagged_sum, 2, 16, 8.0, mark, "again", timeout=15) == [(9.0, 9.0)] * 3


@pytest.mark.parametrize("restart", [False, True], ids=["alone", "with-restart"])
def test_a_run_frozen_inside_a_collective_is_stopped_when_it_wakes(make_cluster, tmp_path, restart):
    """Without a restart nothing else ends the stale allreduce: it waited out its own 30 s deadline
    while the next run queued behind it."""
    c = make_cluster(workers=3, unresponsive_after=0.5)
    mark = str(tmp_path / "mark")
    assert c.run(_tagged_sum, 0, 8, 10.0, mark, "form", timeout=20) == [(3.0, 3.0)] * 3
    stale = _storm_then_check(c, mark, queued=False, restart=restart)
    assert "0 stale end" not in stale, f"worker 0 finished the stopped job after it woke: {stale}"
    assert c.run(_tagged_sum, 2, 16, 8.0, mark, "again", timeout=15) == [(9.0, 9.0)] * 3
