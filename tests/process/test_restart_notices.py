"""A death notice must not outlive the restart it predates (found by tests/process/test_soak.py).

When a worker dies, the cluster's monitor sends each other worker of its job a ``task-gone``
notice (``collectives/_gone.py``), so their collectives fail at once naming the dead pid. Then
``cluster.restart(i)`` starts a new process, and every other worker must drop its old group and
forget the notice. A worker that was *unresponsive* (its heartbeats late: a loaded machine, a long
C call, or stopped by something other than ``cluster.pause``) when the restart ran got the notice
but neither the regroup nor the new spec: once it answered again, each of its collectives failed
with ``PeerLostError: ... pid <the old pid>``, for good. Here the worker is made unresponsive with
a plain SIGSTOP (not ``cluster.pause``, which the cluster tracks), so the sequence is exact.

Also: the notice and the spec that voids it came over two connections, in either order; a notice
read after the spec held on. Now the restart withdraws the notice over the notice's own
connection, naming the pid it was about, so the order is fixed.
"""
import os
import signal
import time

import pytest

pytestmark = pytest.mark.process


def _sum_of_ranks_plus(step):
    import numpy as np

    import flowlab.cluster as cl
    out = cl.allreduce(np.full(16, float(cl.rank() + step)), timeout=5.0)
    return float(out[0])


def _notices():
    """The death notices this worker holds that still count: ``{task: why}``."""
    import flowlab.cluster as cl
    from flowlab.cluster.collectives import _gone
    server = cl.current_server()
    notes = server.state(_gone.__name__)
    return {t: _gone.known(server, t) for t in notes if _gone.known(server, t)}


def _wait_status(c, task, want, within=15.0):
    end = time.monotonic() + within
    while c.status(task) != want:
        assert time.monotonic() < end, f"{c.workers[task]} is {c.status(task)}, not {want}, after {within} s"
        time.sleep(0.05)


def test_a_worker_unresponsive_during_a_restart_forgets_the_old_process(make_cluster):
    c = make_cluster(workers=3, unresponsive_after=0.5)
    assert c.run(_sum_of_ranks_plus, 0, timeout=20) == [3.0] * 3      # the group is formed
    stopped = c.pid(2)
    os.kill(stopped, signal.SIGSTOP)      # not c.pause: the cluster sees only silence
    try:
        _wait_status(c, 2, "unresponsive")
        old = c.pid(1)
        c.kill(1)
        _wait_status(c, 1, "dead")
        time.sleep(0.3)                   # the monitor's notice is on its way to task 2
        t0 = time.monotonic()
        c.restart(1)
        took = time.monotonic() - t0
        assert c.pid(1) != old
    finally:
        os.kill(stopped, signal.SIGCONT)
    # the restart did not wait on the silent task (it used to be skipped; now it is told without waiting)
    assert took < 8.0, f"restart took {took:.1f} s with a task unresponsive"
    _wait_status(c, 2, "alive")
    assert c.call(2, _notices, timeout=10) == {}, "task 2 still holds a notice about the old process"
    for step in (1, 2):
        assert c.run(_sum_of_ranks_plus, step, timeout=20) == [3.0 + 3 * step] * 3


def test_a_notice_read_after_the_new_spec_is_withdrawn(make_cluster):
    """The notice and the spec race over two connections: with task 2 stopped while task 1 dies and
    is restarted, both wait in task 2's sockets, and it reads them in whatever order it picks. Either
    way no notice may hold once the restart returned, and collectives work."""
    c = make_cluster(workers=3, unresponsive_after=0.5)
    assert c.run(_sum_of_ranks_plus, 0, timeout=20) == [3.0] * 3
    for _ in range(3):
        stopped = c.pid(2)
        os.kill(stopped, signal.SIGSTOP)
        try:
            _wait_status(c, 2, "unresponsive")
            c.kill(1)
            _wait_status(c, 1, "dead")
            c.restart(1)
        finally:
            os.kill(stopped, signal.SIGCONT)
        _wait_status(c, 2, "alive")
        assert c.call(2, _notices, timeout=10) == {}
        assert c.run(_sum_of_ranks_plus, 1, timeout=20) == [6.0] * 3


def test_a_death_after_the_restart_is_still_told(make_cluster):
    """Withdrawing names the old pid only: the new process's own death is still told at once."""
    c = make_cluster(workers=3, unresponsive_after=0.5)
    assert c.run(_sum_of_ranks_plus, 0, timeout=20) == [3.0] * 3
    c.kill(1)
    _wait_status(c, 1, "dead")
    c.restart(1)
    assert c.run(_sum_of_ranks_plus, 1, timeout=20) == [6.0] * 3
    new = c.pid(1)
    c.kill(1)
    _wait_status(c, 1, "dead")
    end = time.monotonic() + 5
    while True:
        held = c.call(2, _notices, timeout=10)
        if held or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert "/job:worker/task:1" in held and f"pid {new}" in held["/job:worker/task:1"], held


def test_a_mismatch_at_the_same_count_says_the_ranks_may_be_out_of_step():
    """What the soak saw about once a run after a restart: two ranks at the same count (#1) but in
    different calls. The error used to say only "called different collectives"; it now names the
    count, both calls, and the two causes with what to do about each. (In-process: the wording is
    the collectives' own, whatever the communicator.)"""
    import numpy as np

    from flowlab.cluster import collectives as C
    from flowlab.cluster.collectives import CollectiveMismatchError
    from flowlab.cluster.collectives.local import LocalGroup

    def body(comm):
        C.allreduce(np.ones(16 if comm.rank == 2 else 4096), timeout=2.0)

    with LocalGroup(3) as group:
        results = group.run(body, return_exceptions=True)
    for e in results:
        assert isinstance(e, CollectiveMismatchError) and e.seq == 1, repr(e)
        text = str(e)
        assert "as their collective #1" in text, text
        assert "float64[16]" in text and "float64[4096]" in text, text
        assert "out of step" in text and "cluster.restart(i)" in text and "call again" in text, text
