"""Nothing hangs: a killed, stopped or silent rank, or ranks that call different collectives, make
every rank raise an error that names the missing ranks (or shows both calls), the op and its
sequence number; afterwards the group can go on.

Deadlines of calls meant to fail are short (1 s) so these tests end quickly; no test asserts how long anything took.
"""
import threading

import numpy as np
import pytest

from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import (CollectiveError, CollectiveMismatchError, CollectiveTimeoutError,
                                         LocalGroup, PeerLostError)
from flowlab.cluster.collectives._exchange import comm_state

SHORT = 1.0   # for calls meant to fail; calls meant to succeed get OK
OK = 10.0


def errors_of(results):
    return {r: e for r, e in enumerate(results) if isinstance(e, BaseException)}


@pytest.mark.parametrize("alg", ["ring", "tree", "naive"])
def test_a_killed_rank_makes_every_other_rank_raise_naming_it(alg):
    n, victim = 4, 2

    def body(comm):
        C.allreduce(np.ones(10), algorithm=alg, timeout=OK)           # call #1 works
        if comm.rank == victim:
            comm.group.kill(victim)
        return C.allreduce(np.ones(10), algorithm=alg, timeout=SHORT)  # call #2 cannot

    with LocalGroup(n) as group:
        results = group.run(body, return_exceptions=True)
    errs = errors_of(results)
    assert sorted(errs) == list(range(n)), results
    for r, e in errs.items():
        assert isinstance(e, PeerLostError), (r, repr(e))
        assert e.missing == [victim] and e.op == "allreduce" and e.seq == 2 and e.rank == r
        assert "allreduce #2" in str(e) and f"{victim}" in str(e)
    assert "this rank is killed" in str(errs[victim])


def test_a_stopped_rank_times_out_every_rank_and_is_named_then_the_group_goes_on(alg="ring"):
    n, victim = 4, 3
    stopped = threading.Event()
    gave_up = threading.Barrier(n - 1)   # thaw the victim only once every other rank has its error

    def body(comm):
        first = C.allreduce(np.ones(5), algorithm=alg, timeout=OK)
        if comm.rank == victim:
            comm.group.stop(victim)       # frozen from here on, as under SIGSTOP
            stopped.set()
        else:
            stopped.wait()
        try:
            C.allreduce(np.ones(5), algorithm=alg, timeout=SHORT)
            second = None
        except CollectiveError as e:
            second = e
            if comm.rank != victim:
                gave_up.wait(OK)
            if comm.rank == 0:
                comm.group.resume(victim)   # thaw it once the others gave up
        third = C.allreduce(np.full(5, comm.rank), algorithm=alg, timeout=OK)
        return first, second, third

    with LocalGroup(n) as group:
        results = group.run(body)
    for r, (first, second, third) in enumerate(results):
        assert first.tolist() == [4.0] * 5
        assert isinstance(second, CollectiveError), (r, second)
        if r != victim:
            assert isinstance(second, CollectiveTimeoutError) and isinstance(second, TimeoutError)
            assert second.missing == [victim], (r, str(second))
            assert second.op == "allreduce" and second.seq == 2
            assert "allreduce #2" in str(second) and "no word from rank 3" in str(second)
        assert third.tolist() == [6] * 5     # the group recovered: call #3 works everywhere


def test_a_rank_that_never_calls_is_named_by_the_ranks_waiting_for_it():
    n = 3

    def body(comm):
        if comm.rank == 1:
            return None              # rank 1 skips the call (a bug in the learner's code)
        try:
            C.allreduce(np.ones(3), algorithm="naive", timeout=SHORT)
        except CollectiveTimeoutError as e:
            return e

    with LocalGroup(n) as group:
        results = group.run(body)
    for r in (0, 2):
        assert isinstance(results[r], CollectiveTimeoutError)
        assert results[r].missing == [1] and results[r].seq == 1


def test_a_dropped_link_is_a_timeout_naming_the_silent_rank():
    def body(comm):
        if comm.rank == 1:
            comm.group.drop(1)
        C.barrier(timeout=SHORT)

    with LocalGroup(3) as group:
        results = group.run(body, return_exceptions=True)
    for r in (0, 2):
        assert isinstance(results[r], CollectiveTimeoutError) and results[r].missing == [1], results[r]


def test_a_slow_rank_only_makes_the_call_slower():
    def body(comm):
        return C.allreduce(np.arange(4.0) * comm.rank, algorithm="ring", timeout=OK)

    with LocalGroup(3) as group:
        group.delay(1, 0.02)
        for got in group.run(body):
            assert got.tolist() == [0.0, 3.0, 6.0, 9.0]


@pytest.mark.parametrize("alg", ["ring", "tree", "naive"])
def test_ranks_calling_different_collectives_all_get_a_mismatch_error_showing_both(alg):
    n = 3

    def body(comm):
        x = np.ones(6, np.float32)
        try:
            if comm.rank == 1:
                C.broadcast(x, root=0, algorithm=alg, timeout=SHORT)
            else:
                C.allreduce(x, algorithm=alg, timeout=SHORT)
            second = None
        except CollectiveError as e:
            second = e
        return second, C.allreduce(np.full(2, comm.rank), algorithm=alg, timeout=OK)

    with LocalGroup(n) as group:
        results = group.run(body)
    for r, (err, after) in enumerate(results):
        assert isinstance(err, CollectiveMismatchError), (r, repr(err))
        text = str(err)
        assert "allreduce #1" in text and "broadcast #1" in text, text   # both sides
        assert err.seq == 1 and {err.mine["op"], err.theirs["op"]} == {"allreduce", "broadcast"}
        assert after.tolist() == [3, 3]      # and the group goes on


@pytest.mark.parametrize("field, kwargs1, kwargs_other, shows", [
    ("shape", dict(x=np.ones((2, 3))), dict(x=np.ones((3, 2))), ["float64[2, 3]", "float64[3, 2]"]),
    ("dtype", dict(x=np.ones(4, np.float32)), dict(x=np.ones(4, np.float64)), ["float32[4]", "float64[4]"]),
    ("reduce", dict(x=np.ones(4), op="max"), dict(x=np.ones(4), op="sum"), ["(max, ring)", "(sum, ring)"]),
    ("alg", dict(x=np.ones(4), algorithm="tree"), dict(x=np.ones(4)), ["(sum, tree)", "(sum, ring)"]),
])
def test_mismatched_shape_dtype_op_or_algorithm_is_shown(field, kwargs1, kwargs_other, shows):
    def body(comm):
        kw = dict(kwargs1 if comm.rank == 1 else kwargs_other)
        x = kw.pop("x")
        C.allreduce(x, timeout=SHORT, **kw)

    with LocalGroup(3) as group:
        results = group.run(body, return_exceptions=True)
    assert all(isinstance(e, CollectiveMismatchError) for e in results), results
    for e in results:
        for s in shows:
            assert s in str(e), (field, str(e))
        assert f"differs: {field}:" in str(e), str(e)


def test_calls_in_a_different_order_are_a_mismatch_not_a_hang():
    def body(comm):
        a, b = np.ones(4), np.ones(4)
        if comm.rank == 0:
            C.allreduce(a, timeout=SHORT)
            C.allgather(b, timeout=SHORT)
        else:
            C.allgather(b, timeout=SHORT)
            C.allreduce(a, timeout=SHORT)

    with LocalGroup(2) as group:
        results = group.run(body, return_exceptions=True)
    for e in results:
        assert isinstance(e, CollectiveMismatchError) and e.seq == 1, repr(e)
        assert "allreduce #1" in str(e) and "allgather #1" in str(e)


def test_an_extra_call_on_one_rank_shows_the_sequence_numbers():
    def body(comm):
        if comm.rank == 0:
            C.barrier(timeout=SHORT)        # only rank 0 calls this one
        C.allreduce(np.ones(2), timeout=SHORT)

    with LocalGroup(2) as group:
        results = group.run(body, return_exceptions=True)
    assert isinstance(results[0], CollectiveMismatchError), repr(results[0])
    assert "barrier #1" in str(results[0]) and "allreduce #1" in str(results[0])


def test_errors_form_one_family():
    for cls in (CollectiveTimeoutError, PeerLostError, CollectiveMismatchError):
        assert issubclass(cls, CollectiveError) and issubclass(cls, RuntimeError)
    assert issubclass(CollectiveTimeoutError, TimeoutError)


def test_two_threads_on_one_communicator_is_refused():
    with LocalGroup(2) as group:
        comm = group[0]
        outcome = {}

        def waiting():   # rank 1 never joins, so this call holds the communicator until its deadline
            try:
                C.allreduce(np.ones(1), comm=comm, timeout=3)
            except CollectiveError as e:
                outcome["first"] = e

        t = threading.Thread(target=waiting, daemon=True)
        t.start()
        try:
            while not comm_state(comm).busy.locked():
                t.join(0.005)
            with pytest.raises(RuntimeError, match="another collective is running on this communicator"):
                C.allreduce(np.ones(1), comm=comm, timeout=3)
        finally:
            group.close()
            t.join(10)
    assert not t.is_alive() and isinstance(outcome.get("first"), CollectiveError)


def test_the_default_deadline_is_60_seconds_and_can_be_changed():
    assert C.default_timeout() == 60.0
    C.set_default_timeout(5)
    try:
        assert C.default_timeout() == 5.0
    finally:
        C.set_default_timeout(60)
    with pytest.raises(ValueError):
        C.set_default_timeout(0)


def test_closing_a_group_ends_a_waiting_rank():
    group = LocalGroup(2)
    box = {}

    def waiting():
        try:
            C.allreduce(np.ones(1), comm=group[0], timeout=30)
        except CollectiveError as e:
            box["error"] = e

    t = threading.Thread(target=waiting, daemon=True)
    t.start()
    try:
        while not comm_state(group[0]).busy.locked():
            t.join(0.005)
    finally:
        group.close()
        t.join(10)
    assert not t.is_alive()
    assert isinstance(box["error"], PeerLostError) and "closed" in str(box["error"])
