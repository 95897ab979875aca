"""Collectives on GPU tensors go through NCCL when every rank has a GPU of its own
(flowlab/cluster/collectives/nccl.py): two ranks on threads of one process, one GPU each. NCCL
refuses two ranks of one communicator on the same GPU, so these tests need two GPUs and skip
with fewer (the choice logic without a GPU: tests/unit/test_nccl_choice.py)."""
import numpy as np
import pytest

import flowlab as fl
from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup, nccl
from flowlab.cluster.events import EventLog
from flowlab.core.backends import cupy_backend

pytestmark = pytest.mark.gpu
T = 30.0


@pytest.fixture
def two_gpus():
    if not cupy_backend.available():
        pytest.skip(cupy_backend.why_unavailable())
    if cupy_backend.device_count() < 2:
        pytest.skip(f"NCCL needs a GPU per rank and refuses two ranks on one GPU; this machine has "
                    f"{cupy_backend.device_count()}")
    if getattr(cupy_backend, "nccl", None) is None or cupy_backend.nccl() is None:
        pytest.skip("CuPy's NCCL is not usable here (cupy_backend.nccl() gives None: no nccl library, "
                    "or flowlab's cupy_backend has no nccl() yet)")


def _ranks(call):
    log = EventLog()
    with LocalGroup(2, events=log) as group:
        out = group.run(call)
        whys = [nccl.why_not(group[r]) for r in range(2)]
    return log, out, whys


RNG = np.random.default_rng(0)
DATA = [RNG.standard_normal((5, 3)).astype(np.float32) for _ in range(2)]


def _all(comm):
    with fl.device(f"/gpu:{comm.rank}"):
        t = fl.constant(DATA[comm.rank])
        return {"sum": C.allreduce(t, "sum", comm=comm, timeout=T),
                "mean": C.allreduce(t, "mean", comm=comm, timeout=T),
                "max": C.allreduce(t, "max", comm=comm, timeout=T),
                "bcast": C.broadcast(t, root=1, comm=comm, timeout=T),
                "gather": C.allgather(t, comm=comm, timeout=T),
                "scatter": C.reduce_scatter(t, comm=comm, timeout=T),   # 5 rows: 3 and 2 (NCCL's uneven path)
                "flags": C.allreduce(fl.constant(DATA[comm.rank] > 0), "sum", comm=comm, timeout=T)}


def test_every_collective_runs_on_nccl_and_equals_numpy(two_gpus):
    log, out, whys = _ranks(_all)
    assert whys == [None, None], whys
    algs = {e.name: e.attrs["alg"] for e in log.events(kind="collective") if e.name != nccl.SETUP_OP}
    assert set(algs.values()) == {"nccl"}, algs
    a, b = DATA
    rows = np.array_split(a + b, 2)
    for rank, got in enumerate(out):
        assert all("GPU:" in t.device for t in got.values())
        np.testing.assert_allclose(got["sum"].numpy(), a + b, rtol=1e-6)
        np.testing.assert_allclose(got["mean"].numpy(), (a + b) / 2, rtol=1e-6)
        np.testing.assert_array_equal(got["max"].numpy(), np.maximum(a, b))
        np.testing.assert_array_equal(got["bcast"].numpy(), b)
        np.testing.assert_array_equal(got["gather"].numpy(), np.concatenate([a, b]))
        np.testing.assert_allclose(got["scatter"].numpy(), rows[rank], rtol=1e-6)
        np.testing.assert_array_equal(got["flags"].numpy(), (a > 0) | (b > 0))


def test_the_gradient_of_a_traced_allreduce_runs_on_nccl_too(two_gpus):
    def call(comm):
        with fl.device(f"/gpu:{comm.rank}"):
            w = fl.Variable(DATA[comm.rank])

            @fl.function
            def step():
                with fl.GradientTape() as tape:
                    loss = fl.reduce_sum(C.allreduce(w * w, "mean", comm=comm, timeout=T))
                return tape.gradient(loss, w)
            return step()
    log, out, whys = _ranks(call)
    assert whys == [None, None]
    for rank, g in enumerate(out):      # d/dw_r of sum(mean_r(w_r^2)) summed over ranks' losses
        np.testing.assert_allclose(g.numpy(), 2 * DATA[rank], rtol=1e-5)


def test_flowlab_nccl_0_keeps_gpu_tensors_on_the_host_path(two_gpus, monkeypatch):
    monkeypatch.setenv("FLOWLAB_NCCL", "0")
    log, out, whys = _ranks(lambda comm: C.allreduce(fl.constant(DATA[comm.rank]), comm=comm, timeout=T))
    assert all(w is not None for w in whys)
    assert {e.attrs["alg"] for e in log.events(kind="collective") if e.name != nccl.SETUP_OP} == {"ring"}
    np.testing.assert_allclose(out[0].numpy(), DATA[0] + DATA[1], rtol=1e-6)
