"""Every step of a collective is an event, and the events add up: message counts per algorithm
(ring: 2(N - 1) steps per rank), who talks to whom, and the bytes each algorithm moves."""
import numpy as np
import pytest

from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup
from flowlab.cluster.events import EventLog

T = 10.0


def run_one(n, alg, size=101, segment_bytes=None, call=None):
    log = EventLog()
    call = call or (lambda comm: C.allreduce(np.arange(size, dtype=np.float64) + comm.rank, "sum", alg, timeout=T))
    with LocalGroup(n, events=log, segment_bytes=segment_bytes) as group:
        results = group.run(call)
    return log, results


def by_rank(log, kind):
    out = {}
    for e in log.events(kind=kind):
        out.setdefault(e.rank, []).append(e)
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_takes_2_n_minus_1_steps_per_rank_between_neighbours(n):
    log, _ = run_one(n, "ring")
    sends, recvs, reduces = by_rank(log, "send"), by_rank(log, "recv"), by_rank(log, "reduce")
    for r in range(n):
        assert len(sends[r]) == len(recvs[r]) == 2 * (n - 1)
        assert sorted(e.attrs["step"] for e in sends[r]) == list(range(2 * (n - 1)))
        assert {e.attrs["peer"] for e in sends[r]} == {(r + 1) % n}
        assert {e.attrs["peer"] for e in recvs[r]} == {(r - 1) % n}
        assert len(reduces[r]) == n - 1          # the reduce-scatter half adds, the all-gather half copies
        assert {e.attrs["chunk"] for e in sends[r]} == set(range(n))
    # each of the N chunks goes round twice (n-1 hops each time): 2(N-1) times the tensor in all
    assert sum(e.bytes for e in log.events(kind="send")) == 2 * (n - 1) * 101 * 8


def test_ring_pipelines_large_chunks_in_parts():
    n, size, seg = 3, 300, 128          # chunks of 100 float64 = 800 bytes -> 7 parts of <= 128 bytes
    log, results = run_one(n, "ring", size=size, segment_bytes=seg)
    sends = by_rank(log, "send")
    for r in range(n):
        assert len(sends[r]) == 2 * (n - 1) * 7
        assert max(e.bytes for e in sends[r]) <= seg
        assert {e.attrs["part"] for e in sends[r]} == set(range(7))
    for got in results:
        np.testing.assert_array_equal(got, n * np.arange(size) + n * (n - 1) / 2)


@pytest.mark.parametrize("n, per_rank", [
    (2, {0: 2, 1: 2}),
    (4, {r: 4 for r in range(4)}),                       # 2 log2(4)
    (5, {0: 1, 1: 5, 2: 4, 3: 4, 4: 4}),                 # rank 0 folds into rank 1, which sends the result back
    (6, {0: 1, 1: 5, 2: 1, 3: 5, 4: 4, 5: 4}),
])
def test_tree_takes_about_2_log2_n_steps(n, per_rank):
    log, _ = run_one(n, "tree")
    sends, recvs = by_rank(log, "send"), by_rank(log, "recv")
    assert {r: len(v) for r, v in sends.items()} == per_rank
    assert {r: len(v) for r, v in recvs.items()} == per_rank


@pytest.mark.parametrize("n", [2, 3, 5])
def test_naive_sends_everything_through_rank_0(n):
    log, _ = run_one(n, "naive")
    sends, recvs = by_rank(log, "send"), by_rank(log, "recv")
    assert len(sends[0]) == len(recvs[0]) == n - 1
    for r in range(1, n):
        assert [e.attrs["peer"] for e in sends[r]] == [0] and [e.attrs["peer"] for e in recvs[r]] == [0]
    assert len(log.events(kind="reduce")) == n - 1    # all reductions happen on rank 0
    assert {e.rank for e in log.events(kind="reduce")} == {0}
    assert sum(e.bytes for e in log.events(kind="send")) == 2 * (n - 1) * 101 * 8


def test_every_send_has_a_matching_recv_with_sender_receiver_chunk_bytes_and_times():
    log, _ = run_one(4, "ring", segment_bytes=200)
    sends = {(e.rank, e.attrs["peer"], e.attrs["step"], e.attrs["chunk"], e.attrs["part"]): e
             for e in log.events(kind="send")}
    recvs = {(e.attrs["peer"], e.rank, e.attrs["step"], e.attrs["chunk"], e.attrs["part"]): e
             for e in log.events(kind="recv")}
    assert sends.keys() == recvs.keys()
    for key, s in sends.items():
        r = recvs[key]
        assert s.bytes == r.bytes > 0
        assert s.name == r.name == "allreduce" and s.attrs["seq"] == r.attrs["seq"] == 1
        assert s.attrs["alg"] == "ring" and s.start <= s.end and r.start <= r.end
        assert s.start <= r.end     # a message is received after it started being sent


def test_each_call_is_one_collective_event_per_rank_with_its_sequence_number():
    def body(comm):
        C.allreduce([1.0, 2.0], timeout=T)
        C.broadcast([1, 2, 3], root=1, algorithm="tree", timeout=T)
        C.barrier("naive", timeout=T)

    log, _ = run_one(3, None, call=body)
    calls = log.events(kind="collective")
    assert sorted((e.rank, e.attrs["seq"], e.name, e.attrs["alg"]) for e in calls) == sorted(
        (r, s, name, alg) for r in range(3)
        for s, name, alg in [(1, "allreduce", "ring"), (2, "broadcast", "tree"), (3, "barrier", "naive")])
    assert all(e.attrs["ok"] for e in calls)
    assert {e.bytes for e in calls if e.name == "allreduce"} == {16}


def test_allgather_and_reduce_scatter_move_n_minus_1_blocks_per_rank_on_the_ring():
    n = 4

    def body(comm):
        C.allgather(np.zeros(10), timeout=T)
        C.reduce_scatter(np.zeros(40), timeout=T)

    log, _ = run_one(n, None, call=body)
    for seq in (1, 2):
        sends = [e for e in log.events(kind="send") if e.attrs["seq"] == seq]
        assert len(sends) == n * (n - 1)
        assert sum(e.bytes for e in sends) == n * (n - 1) * 10 * 8
