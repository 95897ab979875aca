"""Distributed properties as checks (flowlab.grading.properties): each holds on a correct
implementation and fails, with a why that names what is wrong, on a broken one; plus the
in-process transport's reorder and message-event switches they rely on."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import flowlab as fl
from flowlab import distribute as ds
from flowlab.cluster.collectives import LocalGroup, PeerGone, allreduce
from flowlab.cluster.events import EventLog
from flowlab.grading.properties import (Verdict, collective_cost, every_rank_holds, no_process_left,
                                        process_snapshot, ring_optimum, same_weights, under_orderings)
from _distribute_helpers import mlp_error, mlp_variables, regression_data


# -- answers a student might hand in ---------------------------------------------------------------
def ring_allreduce(comm, x):
    """A correct ring all-reduce from send and recv: reduce-scatter, then all-gather."""
    n, r = comm.size, comm.rank
    buf = np.array(x, dtype=np.float64)
    if n == 1:
        return buf
    chunks = np.array_split(np.arange(buf.size), n)
    succ = (r + 1) % n
    for step in range(n - 1):
        comm.send(succ, {"step": step}, [buf[chunks[(r - step) % n]]])
        _, _, (arr,) = comm.recv(10)
        buf[chunks[(r - step - 1) % n]] += arr
    for step in range(n - 1):
        comm.send(succ, {"step": n - 1 + step}, [buf[chunks[(r + 1 - step) % n]]])
        _, _, (arr,) = comm.recv(10)
        buf[chunks[(r - step) % n]] = arr
    return buf


def through_rank_0(comm, x):
    """A "ring" that sends everything to rank 0, which adds and sends the total back: right answer,
    (n-1) whole tensors through rank 0's link."""
    x = np.array(x, dtype=np.float64)
    if comm.rank == 0:
        total = x.copy()
        for _ in range(comm.size - 1):
            _, _, (arr,) = comm.recv(10)
            total += arr
        for peer in range(1, comm.size):
            comm.send(peer, {}, [total])
        return total
    comm.send(0, {}, [x])
    return comm.recv(10)[2][0]


def only_rank_0(comm, x):
    """Reduces to rank 0 and forgets to send the total back: only rank 0 is right."""
    x = np.array(x, dtype=np.float64)
    if comm.rank == 0:
        for _ in range(comm.size - 1):
            x = x + comm.recv(10)[2][0]
        return x
    comm.send(0, {}, [x])
    return x


def arrival_order_sum(comm):
    """Rank 0 adds floats in the order they arrive: 1e16 + 1 - 1e16 is 0 or 1 depending on it."""
    values = [0.0, 1e16, 1.0, -1e16]
    if comm.rank == 0:
        time.sleep(0.05)                   # a slow rank 0: every message is there before it reads
        total = values[0]
        for _ in range(comm.size - 1):
            total += float(comm.recv(10)[2][0][0])
        return total
    comm.send(0, {}, [np.array([values[comm.rank]])])
    return None


def rank_order_sum(comm):
    """The same sum, in a fixed order (by sender rank): the same whatever the arrival order."""
    values = [0.0, 1e16, 1.0, -1e16]
    if comm.rank == 0:
        got = {}
        for _ in range(comm.size - 1):
            src, _, (arr,) = comm.recv(10)
            got[src] = float(arr[0])
        total = values[0]
        for src in sorted(got):
            total += got[src]
        return total
    comm.send(0, {}, [np.array([values[comm.rank]])])
    return None


def _x(rank):
    return np.arange(10.0) * (rank + 1)


# -- 1. same weights with 1 and N replicas ---------------------------------------------------------
def _train(n, per_replica_mean=False):
    x, y = regression_data()
    strategy = ds.MirroredStrategy()
    assert strategy.num_replicas_in_sync == n           # same_weights gave this process n devices
    with strategy.scope():
        variables = mlp_variables()
        optimizer = fl.optimizers.SGD(0.1)
    dist = strategy.experimental_distribute_dataset(fl.data.Dataset.from_tensor_slices((x, y)).batch(12))

    def step_fn(inputs):
        xb, yb = inputs
        with fl.GradientTape() as tape:
            err = mlp_error(variables, xb, yb)
            per_example = fl.reduce_sum(err * err, axis=1)
            if per_replica_mean:           # the classic bug: each replica's mean, then summed
                loss = fl.reduce_mean(per_example)
            else:
                loss = ds.compute_average_loss(per_example, global_batch_size=12)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for _ in range(2):
        for batch in dist:
            strategy.run(step_fn, args=(batch,))
    return [v.numpy() for v in variables]


def test_same_weights_holds_for_a_correct_training_loop_and_restores_the_devices():
    cpus, gpus = fl.config.logical_device_count("CPU"), fl.config.logical_device_count("GPU")
    v = same_weights(_train, replicas=(1, 2, 3))
    assert v.ok, v.why
    assert v.details["replicas"] == [1, 2, 3] and v.details["weights"] == 3
    assert "3 weights agree with 1 replica" in v.why
    assert (fl.config.logical_device_count("CPU"), fl.config.logical_device_count("GPU")) == (cpus, gpus)
    json.dumps(v.to_dict())                      # plain data: a grader can record it


def test_same_weights_catches_a_per_replica_mean_and_names_the_weight():
    v = same_weights(lambda n: _train(n, per_replica_mean=True), replicas=(1, 2))
    assert not v.ok
    assert v.why.startswith("weight 0 differs between 1 replica and 2 replicas: largest difference "), v.why
    assert "values beyond rtol 1e-05, atol 1e-06" in v.why
    assert v.details["weight"] == "weight 0" and v.details["largest_difference"] > 1e-3
    assert "✗ same_weights: weight 0 differs" in repr(v)


def test_same_weights_fails_closed_on_errors_objects_and_mismatched_lists():
    def broken(n):
        if n == 2:
            raise ValueError("replica 1 has no data")
        return [np.zeros(3, np.float32)]
    v = same_weights(broken)
    assert not v.ok and v.why == "training with 2 replicas raised ValueError: replica 1 has no data"

    class Weights:                               # an object that claims to equal anything
        def __eq__(self, other):
            return True
    v = same_weights(lambda n: Weights())
    assert not v.ok and "returned test_grading_properties" in v.why and "model.get_weights()" in v.why

    v = same_weights(lambda n: [np.zeros(3, np.float32)] * n)
    assert not v.ok and "returned 2 weights" in v.why

    v = same_weights(lambda n: {"kernel": np.ones(2, np.float32) * n})
    assert not v.ok and "weight 'kernel' differs" in v.why and "largest difference 1" in v.why

    v = same_weights(lambda n: [np.ones(2, np.float32 if n == 1 else np.float64)])
    assert not v.ok and "float32[2] with 1 replica, float64[2] with 2 replicas" in v.why

    with pytest.raises(ValueError, match="two or more whole numbers"):
        same_weights(_train, replicas=(2,))


def test_same_weights_passes_a_strategy_when_asked():
    seen = []

    def train(strategy):
        seen.append(strategy)
        return [np.ones(2, np.float32)]
    v = same_weights(train, replicas=(1, 4), strategy=lambda n: f"strategy of {n}")
    assert v.ok and seen == ["strategy of 1", "strategy of 4"]


# -- 2. messages and bytes against the ring's optimum ----------------------------------------------
def test_ring_optimum_comes_from_the_cost_model():
    assert ring_optimum(4, 1024) == {"max_messages": 6, "max_bytes": 1536}
    assert ring_optimum(1, 1024) == {"max_messages": 0, "max_bytes": 0}
    assert ring_optimum(4, 40, itemsize=4) == {"max_messages": 6, "max_bytes": 64}   # chunks of 2 or 3 floats
    with pytest.raises(ValueError, match="nbytes"):
        ring_optimum(4, -1)


def test_the_built_in_ring_meets_the_optimum_and_naive_does_not():
    x = np.ones(10, np.float32)
    with LocalGroup(4) as group:
        group.run(lambda comm: allreduce(x, algorithm="ring"))
    v = collective_cost(group.events, **ring_optimum(4, x.nbytes, itemsize=4))
    assert v.ok, v.why
    assert v.why.startswith("every rank sent at most 6 messages (limit 6)")
    assert v.details["level"] == "send" and len(v.details["calls"]) == 1
    assert [row["messages"] for row in v.details["per_rank"]] == [6, 6, 6, 6]

    with LocalGroup(4) as group:
        group.run(lambda comm: allreduce(x, algorithm="naive"))
    v = collective_cost(group.events, **ring_optimum(4, x.nbytes, itemsize=4))
    assert not v.ok
    assert v.why.startswith("rank 0 sent 120 bytes (limit 64): more than the limit"), v.why


def test_raw_sends_are_counted_from_message_events():
    x = np.arange(12.0)
    with LocalGroup(4, message_events=True) as group:
        group.run(lambda comm: ring_allreduce(comm, x))
    v = collective_cost(group.events, **ring_optimum(4, x.nbytes, itemsize=8))
    assert v.ok, v.why
    assert v.details["level"] == "message" and v.details["total"]["messages"] == 24

    with LocalGroup(4, message_events=True) as group:
        group.run(lambda comm: through_rank_0(comm, x))
    v = collective_cost(group.events, **ring_optimum(4, x.nbytes, itemsize=8))
    assert not v.ok
    assert v.why == "rank 0 sent 288 bytes (limit 144): more than the limit", v.why
    assert v.details["over"] == ["rank 0"]

    v = collective_cost(group.events, max_messages=5, per_rank=False)
    assert not v.ok and v.why.startswith("the group sent 6 messages (limit 5)")


def test_collective_cost_fails_closed_on_an_empty_or_lossy_log():
    v = collective_cost(EventLog())
    assert not v.ok and "holds no sends" in v.why
    with LocalGroup(2, events=EventLog(maxlen=4)) as group:
        group.run(lambda comm: allreduce(np.ones(8)))
    v = collective_cost(group.events, max_messages=10)
    assert not v.ok and "dropped" in v.why
    events = [e.to_dict() for e in LocalGroup(1).events.events()]      # a list of dicts works too
    assert not collective_cost(events).ok


# -- 3. every rank, not only rank 0 ----------------------------------------------------------------
def test_every_rank_holds_the_right_result():
    with LocalGroup(4) as group:
        results = group.run(lambda comm: ring_allreduce(comm, _x(comm.rank)))
    v = every_rank_holds(results, np.arange(10.0) * 10)
    assert v.ok and v.why == "all 4 ranks hold the right result"
    assert [row["ok"] for row in v.details["per_rank"]] == [True] * 4


def test_a_result_right_only_on_rank_0_fails_naming_the_ranks():
    with LocalGroup(4) as group:
        results = group.run(lambda comm: only_rank_0(comm, _x(comm.rank)))
    v = every_rank_holds(results, np.arange(10.0) * 10)
    assert not v.ok
    assert v.why.startswith("ranks 1, 2, 3 of 4 do not hold the right result (rank 0 does: checking rank 0 "
                            "alone would have missed this); rank 1: at [1]: expected 10.0, got 2.0"), v.why
    assert v.details["wrong"] == [1, 2, 3]


def test_every_rank_holds_per_rank_values_exceptions_and_cheats():
    v = every_rank_holds([np.float64(0.0), 1.0, 2.0], lambda rank: float(rank))
    assert v.ok, v.why

    class Cheat(float):
        def __eq__(self, other):
            return True
    v = every_rank_holds([0.0, Cheat(5.0), KeyError("lost")], lambda rank: float(rank))
    assert not v.ok and v.details["wrong"] == [1, 2]
    assert "rank 1: expected a float, got an object of type" in v.why
    assert v.details["per_rank"][2]["why"] == "raised KeyError: 'lost'"
    assert not every_rank_holds([], 1.0).ok
    assert "one result per rank" in every_rank_holds(np.zeros(3), 0.0).why


# -- 4. no process left behind ---------------------------------------------------------------------
_SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
_STARTER = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
            "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid)")


def test_no_process_left_by_pid():
    proc = subprocess.Popen(_SLEEPER)
    try:
        v = no_process_left([proc.pid], grace=0.2)
        assert not v.ok and v.why.startswith(f"1 process still running 0.2 s later: {proc.pid} (python")
        assert v.details["left"][0]["pid"] == proc.pid and "time.sleep(60)" in v.details["left"][0]["cmdline"]
    finally:
        proc.kill()
        proc.wait(10)
    v = no_process_left([proc.pid], grace=0.2)
    assert v.ok and v.why == "no process left: the 1 process started has ended"


def test_no_process_left_from_a_snapshot_also_finds_orphans():
    before = process_snapshot()
    assert no_process_left(before=before, grace=0).ok
    child = subprocess.Popen(_SLEEPER)
    orphan = None
    try:
        # a process that starts a grandchild and exits at once: the grandchild is orphaned (adopted by init)
        starter = subprocess.run([sys.executable, "-c", _STARTER], capture_output=True, text=True, timeout=30)
        orphan = int(starter.stdout)
        v = no_process_left(before=before, grace=0.2)
        assert not v.ok and v.why.startswith("2 processes still running")
        assert sorted(row["pid"] for row in v.details["left"]) == sorted([child.pid, orphan])
    finally:
        child.kill()
        child.wait(10)
        if orphan is not None:
            try:
                os.kill(orphan, signal.SIGKILL)
            except ProcessLookupError:
                pass
    v = no_process_left(before=before, grace=5)
    assert v.ok, v.why
    with pytest.raises(ValueError, match="either pids"):
        no_process_left()


# -- 5. the same answer under several message orders -----------------------------------------------
def test_collectives_and_a_raw_ring_give_the_same_answer_under_every_ordering():
    v = under_orderings(lambda comm: allreduce(_x(comm.rank), algorithm="naive"), 4)
    assert v.ok, v.why
    assert v.details["orderings"] > 1            # rank 0 of the naive algorithm hears from 3 senders
    v = under_orderings(lambda comm: ring_allreduce(comm, _x(comm.rank)), 4, seeds=(0, 1, 2))
    assert v.ok and v.details["orderings"] == 1 and "only one delivery order came up" in v.why
    assert under_orderings(rank_order_sum, 4).ok


def test_an_answer_that_depends_on_arrival_order_is_caught():
    v = under_orderings(arrival_order_sum, 4)
    assert not v.ok
    # (with every message there before rank 0 reads, seed 0 gives 0.0 and seed 1 gives 1.0 here)
    assert re.fullmatch(r"the answer depends on the message order: rank 0 under ordering 0: (0\.0|1\.0), "
                        r"under ordering \d: (0\.0|1\.0)", v.why), v.why
    assert v.details["rank"] == 0 and v.details["failed_seed"] in (1, 2, 3, 4)
    json.dumps(v.to_dict())


def test_orderings_that_break_or_hang_an_answer_fail():
    def first_from_rank_1(comm):
        if comm.rank == 0:
            time.sleep(0.02)
            src = [comm.recv(10)[0] for _ in range(comm.size - 1)]
            assert src[0] == 1, f"expected rank 1 first, got rank {src[0]}"
            return src
        comm.send(0, {}, [])
    v = under_orderings(first_from_rank_1, 3, seeds=range(6))
    assert not v.ok and "rank 0 raised AssertionError: expected rank 1 first, got rank 2" in v.why

    def waits_forever(comm):
        if comm.rank == 0:
            comm.recv(None)                      # nobody sends: only the group's closing ends it
    v = under_orderings(waits_forever, 2, seeds=(0,), timeout=0.5)
    assert not v.ok and v.why.startswith("under ordering 0 the ranks did not finish within 0.5 s")


# -- the transport's switches ----------------------------------------------------------------------
def test_reordering_keeps_each_senders_order_and_is_seeded():
    def body(comm):
        if comm.rank == 0:
            time.sleep(0.1)                # every message is there before rank 0 reads: the seed decides
            return [(src, int(arrays[0][0])) for src, _, arrays in (comm.recv(10) for _ in range(20))]
        for i in range(10):
            comm.send(0, {}, [np.array([i])])

    orders = []
    for seed in (0, 0, 1):
        with LocalGroup(3, reorder_seed=seed) as group:
            got = group.run(body)[0]
        for src in (1, 2):
            assert [i for s, i in got if s == src] == list(range(10))     # FIFO per sender
        assert group.deliveries[0] == [s for s, _ in got]
        orders.append([s for s, _ in got])
    assert orders[0] == orders[1] != orders[2]
    assert LocalGroup(2).deliveries is None


def test_reordering_leaves_collectives_exact_and_faults_working():
    for algorithm in ("ring", "tree", "naive"):
        with LocalGroup(3, reorder_seed=7) as group:
            results = group.run(lambda comm: allreduce(_x(comm.rank), algorithm=algorithm))
        assert all(np.array_equal(r, np.arange(10.0) * 6) for r in results), algorithm
    with LocalGroup(2, reorder_seed=0) as group:
        group[1].send(0, {"n": 1}, [np.ones(2)])
        group.kill(1)
        assert group[0].recv(1)[1] == {"n": 1}               # what it sent before it died comes first
        with pytest.raises(PeerGone, match="rank 1 killed"):
            group[0].recv(1)
        with pytest.raises(TimeoutError):
            group[0].recv(0.05)


def test_message_events_record_every_raw_send():
    with LocalGroup(2, message_events=True) as group:
        group[0].send(1, {}, [np.ones(3, np.float32), np.ones(2, np.int64)])
        group[1].recv(1)
    (e,) = group.events.events(kind="message")
    assert (e.name, e.rank, e.bytes, e.attrs) == ("inproc", 0, 28, {"peer": 1})
    with LocalGroup(2) as group:
        group[0].send(1, {}, [np.ones(3)])
    assert group.events.events(kind="message") == []


def test_verdict_is_plain_data():
    v = Verdict(True, "fine", {"property": "x", "n": 1})
    assert bool(v) and v.to_dict() == {"ok": True, "why": "fine", "details": {"property": "x", "n": 1}}
    assert repr(v) == "✓ x: fine" and not Verdict(False, "no")
