"""Real workers: every wait of a collective, forming its group included, ends by the caller's
deadline with a collective error naming the ranks it waited for; a peer the cluster's monitor
knows is dead fails the collective at once, named with its pid, how it ended and the restart call.

(Before: a collective whose group had not formed waited a fixed 30 s, whatever its ``timeout``,
and raised a bare TimeoutError naming no rank.)"""
import time

import pytest

from _processes import free_ports

pytestmark = pytest.mark.process

DEADLINE = 5.0        # the collective's own timeout in these tests
FORMED_BY = 30.0      # the fixed wait group formation used to have


def allreduce_outcome(timeout=DEADLINE, join_first=False):
    """Run an allreduce on this worker; (error class name, message, seconds, is a TimeoutError),
    or ("ok", result, seconds, False)."""
    import time

    import numpy as np

    import flowlab as fl
    if join_first:
        fl.cluster.barrier(timeout=60)
    start = time.monotonic()
    try:
        out = fl.cluster.allreduce(np.ones(4, np.float32), timeout=timeout)
    except Exception as e:   # noqa: BLE001 - what the test looks at
        return type(e).__name__, str(e), time.monotonic() - start, isinstance(e, TimeoutError)
    return "ok", out.tolist(), time.monotonic() - start, False


def plain_allreduce(timeout=DEADLINE):
    import numpy as np

    import flowlab as fl
    return fl.cluster.allreduce(np.ones(4, np.float32), timeout=timeout)


def barrier():
    import flowlab as fl
    fl.cluster.barrier(timeout=60)


def wait_dead(cluster, task, limit=10.0):
    end = time.monotonic() + limit
    while cluster.status(task) != "dead":
        assert time.monotonic() < end, f"the monitor never saw worker {task} dead"
        time.sleep(0.02)


def test_a_dead_peer_fails_group_formation_at_once_naming_it(make_cluster):
    cluster = make_cluster(workers=2)
    pid = cluster.pid(1)
    cluster.kill(1)
    wait_dead(cluster, 1)
    start = time.monotonic()
    kind, text, took, _ = cluster.call(0, allreduce_outcome, timeout=60)
    assert time.monotonic() - start < FORMED_BY
    assert kind == "PeerLostError", (kind, text)
    assert took < 1.0, f"took {took:.2f} s to fail on a peer the monitor knew was dead: {text}"
    for part in ("allreduce", "rank 1", "/job:worker/task:1", f"pid {pid}", "SIGKILL", "cluster.restart(1)"):
        assert part in text, (part, text)
    # as the caller sees it: the worker's PeerLostError, raised here (a RemoteError of that class)
    from flowlab.cluster.collectives import PeerLostError
    start = time.monotonic()
    with pytest.raises(PeerLostError, match=r"rank 1 exited \(/job:worker/task:1"):
        cluster.call(0, plain_allreduce, timeout=60)
    assert time.monotonic() - start < FORMED_BY / 2


def test_a_peer_that_dies_after_the_group_formed_is_named_with_how_it_ended(make_cluster):
    cluster = make_cluster(workers=2)
    cluster.run(barrier, timeout=60)
    pid = cluster.pid(1)
    cluster.kill(1)
    wait_dead(cluster, 1)
    kind, text, took, _ = cluster.call(0, allreduce_outcome, timeout=60)
    assert kind == "PeerLostError", (kind, text)
    assert took < 1.0, text
    for part in ("rank 1", f"pid {pid}", "SIGKILL", "cluster.restart(1)"):
        assert part in text, (part, text)


@pytest.mark.parametrize("workers", [2, 3])
def test_after_restart_the_notice_no_longer_holds(make_cluster, workers):
    cluster = make_cluster(workers=workers)
    cluster.kill(1)
    wait_dead(cluster, 1)
    for survivor in [0] + list(range(2, workers)):
        assert cluster.call(survivor, allreduce_outcome, timeout=60)[0] == "PeerLostError"
    cluster.restart(1)
    results = cluster.run(allreduce_outcome, timeout=60)
    assert [r[:2] for r in results] == [("ok", [float(workers)] * 4)] * workers, results


def test_a_peer_that_never_calls_a_collective_fails_by_the_callers_deadline(make_cluster):
    cluster = make_cluster(workers=2)
    kind, text, took, is_timeout = cluster.call(0, allreduce_outcome, 3.0, timeout=60)
    assert kind == "CollectiveTimeoutError", (kind, text)
    assert is_timeout, "a collective's timeout is still a TimeoutError"
    assert 2.5 < took < 3.0 + 2.5, f"waited {took:.2f} s for a 3 s deadline: {text}"
    for part in ("allreduce #1", "rank 1", "/job:worker/task:1", "has not called a collective"):
        assert part in text, (part, text)


def test_a_peer_that_never_started_fails_by_the_callers_deadline(make_cluster):
    cluster = make_cluster(workers=1)
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    mine = cluster.spec.as_dict()["worker"][0]
    # worker 0 is told its job has a second task, at an address where nothing listens
    cluster.client.request_all(cluster.workers, "spec", {"cluster": {"worker": [mine, nobody]}}, timeout=10)
    kind, text, took, is_timeout = cluster.call(0, allreduce_outcome, 3.0, timeout=60)
    assert kind == "CollectiveTimeoutError" and is_timeout, (kind, text)
    assert 2.5 < took < 3.0 + 2.5, f"waited {took:.2f} s for a 3 s deadline: {text}"
    for part in ("rank 1", nobody, "never answered"):
        assert part in text, (part, text)


def idle_then_late_allreduce(idle=6.0, late=1.5):
    """Both ranks join, stay idle longer than the communicator's 5 s peer timeout, then rank 1 comes
    ``late`` seconds after rank 0 (before: rank 0 called rank 1 dead at once, "silent for more
    than 5 s", and rank 1 then waited its whole deadline)."""
    import time

    import numpy as np

    import flowlab as fl
    fl.cluster.barrier(timeout=30)
    time.sleep(idle + (late if fl.cluster.rank() == 1 else 0.0))
    try:
        return fl.cluster.allreduce(np.ones(2), timeout=20).tolist()
    except Exception as e:   # noqa: BLE001 - what the test looks at
        return f"{type(e).__name__}: {e}"


def test_a_peer_idle_between_collectives_is_not_taken_for_dead(make_cluster):
    cluster = make_cluster(workers=2)
    assert cluster.run(idle_then_late_allreduce, timeout=60) == [[2.0, 2.0]] * 2
