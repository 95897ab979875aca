"""Injected faults on the shared-memory channels between LocalCluster workers (one host): a delay
slows every collective the task joins (and the value is still right), a drop fails the call at its
deadline naming the rank, a corrupt fault is caught by the checksum shm chunks carry while it is set
(never a wrong value), and clear_faults restores the speed.

``cluster.drop`` and ``cluster.corrupt`` also act on the ``run`` request that carries the test's
function to the task (and on its reply), so those tests set the fault from inside the call, through
the ``fault`` message's own handler (``faults.control``), and clear it before the call returns."""
import pytest

from flowlab.cluster.collectives import shm

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(shm.unavailable() is not None, reason=str(shm.unavailable()))]

SMALL, LARGE = 1 << 10, 1 << 20        # float32 elements: a native call's box, and its windows


def _allreduce(n, alg="ring", timeout=30.0, fault=None, on=(1,), raise_errors=False):
    """One allreduce of ``n`` float32 (each rank contributes rank + 1) after a warm-up that forms
    the group; with ``fault``, the ranks in ``on`` set it (faults.control) just for the timed call.
    Errors are returned, or with ``raise_errors`` raised (so the cluster's client sees the call
    failed, stops it everywhere and brings the ranks back in step, as for a user's call)."""
    import time

    import numpy as np

    import flowlab as fl
    from flowlab.cluster import faults
    from flowlab.cluster.collectives.zmq import for_server
    from flowlab.cluster.server import current_server

    srv = current_server()
    r = fl.cluster.rank()
    try:
        fl.cluster.allreduce(np.ones(4, np.float32), algorithm=alg)
    except Exception as e:  # noqa: BLE001 - e.g. the abort of a call a peer failed earlier
        return {"ok": False, "type": type(e).__name__, "error": str(e), "warmup": True}
    mine = fault is not None and r in on
    if mine:
        faults.control(srv, fault)
    x = np.full(n, r + 1.0, np.float32)
    t0 = time.perf_counter()
    try:
        y = fl.cluster.allreduce(x, algorithm=alg, timeout=timeout)
        out = {"ok": True, "lo": float(y.min()), "hi": float(y.max())}
    except Exception as e:  # noqa: BLE001 - reported to the test
        if raise_errors:
            raise
        out = {"ok": False, "type": type(e).__name__, "error": str(e)}
    finally:
        hit = srv.faults.describe() if mine and srv.faults is not None else None
        if mine:
            faults.control(srv, {"clear": True})
    out["seconds"] = time.perf_counter() - t0
    if mine:
        out["hit"] = hit
    out["channels"] = list(for_server(srv).channels)
    return out


def _right(res, n_ranks=2):
    want = n_ranks * (n_ranks + 1) / 2
    return res["ok"] and res["lo"] == res["hi"] == want


@pytest.mark.parametrize("alg,n", [("ring", LARGE), ("native", SMALL), ("native", LARGE)])
def test_delay_slows_shm_collectives_and_clear_faults_restores_them(make_cluster, alg, n):
    c = make_cluster(workers=2)
    first = c.run(_allreduce, n, alg, timeout=60)
    assert [r["channels"] for r in first] == [[None, "shm"], ["shm", None]]
    assert all(_right(r) for r in first), first
    c.delay(1, 400)
    slow = c.run(_allreduce, n, alg, timeout=60)
    assert all(_right(r) for r in slow), slow
    assert all(r["seconds"] >= 0.4 for r in slow), slow       # rank 0 waits for rank 1's late chunks
    c.clear_faults()
    fast = c.run(_allreduce, n, alg, timeout=60)
    assert all(_right(r) for r in fast), fast
    assert all(r["seconds"] < 0.35 for r in fast), fast       # generous: it no longer waits 0.4 s


@pytest.mark.parametrize("alg,n", [("ring", LARGE), ("tree", SMALL), ("native", SMALL), ("native", LARGE)])
def test_drop_fails_the_call_at_its_deadline_naming_the_rank(make_cluster, alg, n):
    import time

    c = make_cluster(workers=2)
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        c.run(_allreduce, n, alg, 2.0, {"drop": 1.0}, (1,), True, timeout=60)
    took = time.monotonic() - t0
    text = str(info.value)
    assert "CollectiveTimeoutError" in text and "rank 1" in text, text
    assert "dropped" in text and "cluster.drop" in text or "no word from rank 1" in text, text
    assert took < 2.0 + 10.0, text                               # its deadline (plus grace and stop), no hang
    # the group goes on. A native call that one rank finished (its peer's box was there) and the
    # other gave up may fail a following call too (the abort reaches the finisher later); the
    # client brings the ranks back in step after each failed call. Never a wrong value.
    good = 0
    for _ in range(6):
        try:
            res = c.run(_allreduce, n, alg, 10.0, None, (1,), True, timeout=60)
        except Exception as e:  # noqa: BLE001 - a collective error, named
            assert "Collective" in str(e), e
            good = 0
            continue
        assert all(_right(r) for r in res), res
        good += 1
        if good == 2:
            break
    assert good == 2


@pytest.mark.parametrize("alg,n", [("ring", LARGE), ("naive", SMALL), ("native", SMALL), ("native", LARGE)])
def test_corrupt_is_caught_never_a_wrong_value(make_cluster, alg, n):
    c = make_cluster(workers=2)
    res = c.run(_allreduce, n, alg, 20.0, {"corrupt": 1.0}, timeout=60)
    assert res[1]["hit"]["corrupted"] >= 1, res
    for r in res:
        assert not r["ok"] and r["type"] == "CollectiveError", res
        assert "corrupt" in r["error"] and "rank 1" in r["error"], res
        assert r["seconds"] < 10, res                            # caught at once, not at the deadline
    # a corrupt fault that never hits: every chunk carries the checksum, and each one checks out
    ok = c.run(_allreduce, n, alg, 20.0, {"corrupt": 1e-12}, timeout=60)
    assert all(_right(r) for r in ok), ok


def _three_ranks_delay():
    return _allreduce(LARGE, "ring", 30.0, {"delay_ms": 300}, on=(2,))


def test_a_delay_on_one_of_three_ranks_slows_the_ring(make_cluster):
    c = make_cluster(workers=3)
    res = c.run(_three_ranks_delay, timeout=60)
    assert all(_right(r, 3) for r in res), res
    assert all(r["seconds"] >= 0.3 for r in res), res
