"""Collectives on the in-process transport, checked by invariant: results equal the closed form
for every algorithm, N = 1 to 5, odd sizes and every dtype; every rank gets the same bits; the
caller's types come back; bad arguments say what is allowed.

Ranks are real threads (``LocalGroup.run``), so messages really cross between threads."""
import subprocess
import sys
import threading

import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup

ALGS = ["ring", "tree", "naive"]
SIZES = [0, 1, 7, 13, 100]
T = 10.0   # deadline of every call here: generous (the machine is shared), never reached when all is well


def seeded(size, rank, dtype=np.float64):
    return (np.arange(size) + rank).astype(dtype)


def closed_form(op, size, n):
    a = np.arange(size, dtype=np.float64)
    return {"sum": n * a + n * (n - 1) / 2, "mean": a + (n - 1) / 2, "max": a + n - 1, "min": a,
            "prod": np.prod([a + k for k in range(n)], axis=0) if n else a}[op]


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("segment_bytes", [None, 24])
def test_allreduce_equals_the_closed_form(alg, n, segment_bytes):
    def body(comm):
        out = {}
        for op in C.REDUCTIONS:
            for size in SIZES:
                out[op, size] = C.allreduce(seeded(size, comm.rank), op, alg, timeout=T)
        return out

    with LocalGroup(n, segment_bytes=segment_bytes) as group:
        results = group.run(body)
    for rank, out in enumerate(results):
        for (op, size), got in out.items():
            assert got.dtype == np.float64 and got.shape == (size,)
            np.testing.assert_array_equal(got, closed_form(op, size, n), err_msg=f"{alg} rank {rank} {op} {size}")


@pytest.mark.parametrize("alg", ALGS)
def test_every_rank_gets_the_same_bits(alg):
    def body(comm):
        x = np.random.default_rng(comm.rank).standard_normal(1001).astype(np.float32)
        return C.allreduce(x, "sum", alg, timeout=T), C.allreduce(x, "mean", alg, timeout=T)

    with LocalGroup(5, segment_bytes=256) as group:
        results = group.run(body)
    xs = [np.random.default_rng(r).standard_normal(1001).astype(np.float32) for r in range(5)]
    for s, m in results:
        assert s.tobytes() == results[0][0].tobytes() and m.tobytes() == results[0][1].tobytes()
        np.testing.assert_allclose(s, np.sum(xs, axis=0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m, np.mean(xs, axis=0), rtol=1e-5, atol=1e-5)


FLOWLAB_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]


@pytest.mark.parametrize("alg", ALGS)
def test_every_dtype_the_engine_has(alg):
    n = 3
    assert sorted(FLOWLAB_DTYPES) == sorted(d.name for d in fl.core.dtypes._BY_NUMPY.values())

    def value(rank, dtype):
        if dtype == "bool":
            return np.arange(9) % 3 == rank     # each position true on exactly one rank
        return (np.arange(9) % 4 + rank).astype(dtype)

    def body(comm):
        out = {}
        for dtype in FLOWLAB_DTYPES:
            for op in C.REDUCTIONS:
                if op == "mean" and dtype == "bool":
                    continue
                out[dtype, op] = C.allreduce(value(comm.rank, dtype), op, alg, timeout=T)
        return out

    with LocalGroup(n) as group:
        results = group.run(body)
    for out in results:
        for (dtype, op), got in out.items():
            assert got.dtype == np.dtype(dtype), (dtype, op)
            vals = [value(r, dtype) for r in range(n)]
            if dtype == "bool":
                want = {"sum": np.any, "max": np.any, "prod": np.all, "min": np.all}[op](vals, axis=0)
            else:
                wide = np.array(vals, dtype=np.float64)
                want = {"sum": wide.sum(0), "mean": np.trunc(wide.sum(0) / n), "max": wide.max(0),
                        "min": wide.min(0), "prod": wide.prod(0)}[op].astype(dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {op}")


def test_integer_mean_rounds_toward_zero():
    with LocalGroup(3) as group:
        results = group.run(lambda comm: C.allreduce(np.array([[-1, 1, -5, 7]])[:, :] * (comm.rank == 0),
                                                     "mean", "ring", timeout=T))
    assert results[0].tolist() == [[0, 0, -1, 2]]    # -1/3 -> 0, -5/3 -> -1, 7/3 -> 2


@pytest.mark.parametrize("alg", ALGS)
def test_broadcast_from_every_root(alg):
    def body(comm):
        return [C.broadcast(seeded(7, 100 * comm.rank).reshape(7, 1), root, alg, timeout=T)
                for root in range(comm.size)]

    for n in (1, 2, 3, 5):
        with LocalGroup(n, segment_bytes=16) as group:
            for out in group.run(body):
                for root, got in enumerate(out):
                    np.testing.assert_array_equal(got, seeded(7, 100 * root).reshape(7, 1))


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_allgather_concatenates_in_rank_order(alg, n):
    def body(comm):
        r = comm.rank
        return (C.allgather(np.full((2, 3), r, np.int16), alg, timeout=T),
                C.allgather(np.float32(r), alg, timeout=T),
                C.allgather(np.arange(5.0) + 10 * r, alg, timeout=T))

    with LocalGroup(n, segment_bytes=8) as group:
        for rows, scalars, odd in group.run(body):
            assert rows.shape == (2 * n, 3) and rows.dtype == np.int16
            assert rows[:, 0].tolist() == [r for r in range(n) for _ in range(2)]
            assert scalars.tolist() == list(range(n)) and scalars.dtype == np.float32
            assert odd.tolist() == [i + 10 * r for r in range(n) for i in range(5)]


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_reduce_scatter_gives_each_rank_its_rows(alg, n):
    rows = 7   # 7 rows never divide evenly by 2..5 ranks

    def body(comm):
        x = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + comm.rank
        return C.reduce_scatter(x, "sum", alg, timeout=T), C.reduce_scatter(x, "max", alg, timeout=T)

    with LocalGroup(n) as group:
        results = group.run(body)
    total = sum(np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + r for r in range(n))
    top = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + n - 1
    for r, (s, m) in enumerate(results):
        np.testing.assert_array_equal(s, np.array_split(total, n)[r])
        np.testing.assert_array_equal(m, np.array_split(top, n)[r])
    assert sum(len(s) for s, _ in results) == rows


@pytest.mark.parametrize("alg", ALGS)
def test_barrier_lets_nobody_through_until_everyone_arrived(alg):
    n = 4
    log, lock = [], threading.Lock()

    def body(comm):
        with lock:
            log.append(("before", comm.rank))
        C.barrier(alg, timeout=T)
        with lock:
            log.append(("after", comm.rank))

    with LocalGroup(n) as group:
        group.delay(2, 0.05)     # one slow rank: the others must still wait for it
        group.run(body)
    kinds = [k for k, _ in log]
    assert kinds == ["before"] * n + ["after"] * n, log


def test_results_come_back_in_the_callers_type_and_inputs_are_untouched():
    def body(comm):
        arr = np.arange(6, dtype=np.float32).reshape(2, 3)
        keep = arr.copy()
        outs = {
            "ndarray": C.allreduce(arr),
            "tensor": C.allreduce(fl.constant([[1.0, 2.0]])),
            "variable": C.allreduce(fl.Variable([1.0, 2.0])),
            "npscalar": C.allreduce(np.int32(3)),
            "float": C.allreduce(2.5),
            "int": C.allreduce(4),
            "list": C.allreduce([[1, 2], [3, 4]]),
            "gathered ints": C.allgather(comm.rank * 10),
        }
        assert np.array_equal(arr, keep)
        return outs

    with LocalGroup(2) as group:
        outs = group.run(body)[1]
    assert type(outs["ndarray"]) is np.ndarray and outs["ndarray"].shape == (2, 3)
    assert outs["ndarray"].tolist() == [[0, 2, 4], [6, 8, 10]]
    assert type(outs["tensor"]) is fl.Tensor and outs["tensor"].dtype == fl.float32
    assert outs["tensor"].numpy().tolist() == [[2.0, 4.0]]
    assert type(outs["variable"]) is fl.Tensor and outs["variable"].numpy().tolist() == [2.0, 4.0]
    assert isinstance(outs["npscalar"], np.int32) and outs["npscalar"] == 6
    assert type(outs["float"]) is float and outs["float"] == 5.0
    assert type(outs["int"]) is int and outs["int"] == 8
    assert type(outs["list"]) is np.ndarray and outs["list"].tolist() == [[2, 4], [6, 8]]
    assert type(outs["gathered ints"]) is np.ndarray and outs["gathered ints"].tolist() == [0, 10]


def test_a_process_alone_is_a_group_of_one():
    x = np.arange(3.0)
    y = C.allreduce(x, "mean")
    assert y.tolist() == [0.0, 1.0, 2.0] and y is not x
    assert C.allgather(x).tolist() == [0.0, 1.0, 2.0]
    assert C.reduce_scatter(x).tolist() == [0.0, 1.0, 2.0]
    assert C.broadcast(x).tolist() == [0.0, 1.0, 2.0]
    C.barrier()
    assert C.current().size == 1


def test_bad_arguments_say_what_is_allowed():
    with LocalGroup(2) as group:
        comm = group[0]
        with pytest.raises(ValueError, match="unknown reduction 'avg'.*sum, mean, max, min, prod"):
            C.allreduce([1.0], "avg", comm=comm)
        with pytest.raises(ValueError, match="unknown algorithm 'star'.*ring, tree, naive, native"):
            C.allreduce([1.0], comm=comm, algorithm="star")
        with pytest.raises(ValueError, match="'native' needs a transport.*LocalCommunicator"):
            C.allreduce([1.0], comm=comm, algorithm="native")
        with pytest.raises(TypeError, match="mean of bool"):
            C.allreduce([True], "mean", comm=comm)
        with pytest.raises(TypeError, match="no dtype for"):
            C.allreduce(np.array([1j]), comm=comm)
        with pytest.raises(ValueError, match="at least one dimension"):
            C.reduce_scatter(1.0, comm=comm)
        with pytest.raises(ValueError, match="root must be a rank in 0..1"):
            C.broadcast([1.0], root=2, comm=comm)
        with pytest.raises(ValueError, match="timeout must be positive"):
            C.allreduce([1.0], comm=comm, timeout=0)


def test_importing_collectives_imports_neither_mpi4py_nor_zmq():
    code = ("import sys, flowlab.cluster.collectives as c; from flowlab.cluster.collectives import *; "
            "print(sorted(m for m in ('mpi4py', 'zmq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("n", [1, 3])
def test_allreduce_into_out_and_in_place(alg, n):
    def body(comm):
        x = seeded(13, comm.rank, np.float32)
        out = np.full(13, -1.0, np.float32)
        got = C.allreduce(x, "sum", alg, timeout=T, out=out)
        kept = x.copy()
        inplace = C.allreduce(x, "mean", alg, timeout=T, out=x)
        return got is out, out.copy(), kept, inplace is x, x.copy()

    with LocalGroup(n) as group:
        results = group.run(body)
    for rank, (same, out, kept, same_inplace, x) in enumerate(results):
        assert same and same_inplace
        np.testing.assert_allclose(out, closed_form("sum", 13, n), rtol=1e-6)
        np.testing.assert_array_equal(kept, seeded(13, rank, np.float32))   # out=out leaves x alone
        np.testing.assert_allclose(x, closed_form("mean", 13, n), rtol=1e-6)


def test_allreduce_out_is_checked():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"out has shape \(3, 2\).*result has shape \(2, 3\)"):
        C.allreduce(x, out=np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match="dtype float64"):
        C.allreduce(x, out=np.empty((2, 3), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        C.allreduce(x, out=np.empty((3, 2), np.float32).T)
    with pytest.raises(TypeError, match="numpy array"):
        C.allreduce(x, out=[[0.0] * 3] * 2)
    t = fl.Variable(np.ones(3, np.float32))
    with fl.GradientTape():
        with pytest.raises(ValueError, match="not differentiable"):
            C.allreduce(t, out=np.empty(3, np.float32))
    view = np.arange(8, dtype=np.float32)
    got = C.allreduce(view[:6], out=view[2:])          # overlapping, not the same elements: input read first
    np.testing.assert_array_equal(got, [0, 1, 2, 3, 4, 5])
