"""How collectives on Tensors choose between NCCL and the host (flowlab/cluster/collectives/nccl.py),
checked without a GPU: where no GPU is, nothing changes (no setup call, the same events and
results as numpy inputs); with a simulated GPU (tests/unit/_simgpu.py, which has no NCCL) the
group makes its one setup allgather, decides "host", and the results come back on the GPU; and
the decision rule itself, on setup rows. NCCL itself runs in tests/gpu/test_nccl.py."""
import numpy as np

import flowlab as fl
from flowlab.cluster import collectives as C
from flowlab.cluster.collectives import LocalGroup, nccl
from flowlab.cluster.events import EventLog

T = 10.0


def _shape(log):
    """The events that show what a call did: (kind, name, rank, alg, peer, step), in a stable order."""
    return sorted((e.kind, e.name, e.rank, e.attrs.get("alg"), e.attrs.get("peer", -1), e.attrs.get("step", -1))
                  for e in log.events() if e.kind in ("collective", "send", "recv", "reduce"))


def _run(call, n=2):
    log = EventLog()
    with LocalGroup(n, events=log) as group:
        out = group.run(call)
        whys = [nccl.why_not(group[r]) for r in range(n)]
    return log, out, whys


def test_without_a_gpu_tensors_take_the_host_path_with_the_same_events_as_arrays():
    data = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(3)]
    log_t, got_t, whys = _run(lambda comm: [C.allreduce(fl.constant(data[comm.rank]), "mean", comm=comm, timeout=T),
                                            C.allgather(fl.constant(data[comm.rank]), comm=comm, timeout=T)], 3)
    log_a, got_a, _ = _run(lambda comm: [C.allreduce(data[comm.rank], "mean", comm=comm, timeout=T),
                                         C.allgather(data[comm.rank], comm=comm, timeout=T)], 3)
    assert _shape(log_t) == _shape(log_a) and _shape(log_t)      # no setup call, no "nccl" anywhere
    assert whys == [None] * 3                                    # never asked
    for (red_t, gat_t), (red_a, gat_a) in zip(got_t, got_a):
        np.testing.assert_allclose(red_t.numpy(), red_a)
        np.testing.assert_array_equal(gat_t.numpy(), gat_a)
    np.testing.assert_allclose(got_a[0][0], sum(data) / 3)


def test_a_simulated_gpu_group_sets_up_once_then_falls_back_to_the_host(gpus):
    fl.config.set_logical_devices("GPU", 2)
    x = [np.array([1.0, 2.0, 3.0], np.float32), np.array([10.0, 20.0, 30.0], np.float32)]

    def call(comm):
        with fl.device(f"/gpu:{comm.rank}"):
            t = fl.constant(x[comm.rank])
            first = C.allreduce(t, comm=comm, timeout=T)
            second = C.broadcast(t, root=1, comm=comm, timeout=T)
        return first, second

    log, out, whys = _run(call)
    setups = [e for e in log.events(kind="collective") if e.name == nccl.SETUP_OP]
    assert sorted(e.rank for e in setups) == [0, 1]              # one setup per rank, not one per call
    assert all(w is not None and "no GPU with NCCL" in w for w in whys), whys
    algs = {e.attrs["alg"] for e in log.events(kind="collective") if e.name != nccl.SETUP_OP}
    assert algs == {"ring"}                                      # the host path ran them
    for rank, (first, second) in enumerate(out):
        assert "GPU" in first.device and "GPU" in second.device   # results back where the inputs were
        np.testing.assert_array_equal(first.numpy(), x[0] + x[1])
        np.testing.assert_array_equal(second.numpy(), x[1])


def _rows(*ranks):
    """Setup rows from (ready, host, device) triples (the NCCL id words left zero)."""
    rows = np.zeros((len(ranks), 3 + 16), np.int64)
    rows[:, :3] = ranks
    return rows


def test_nccl_only_when_every_rank_has_a_gpu_of_its_own():
    assert nccl.decide(_rows((1, 7, 0), (1, 7, 1), (1, 9, 0), (1, 9, 1))) is None   # 2 hosts x 2 GPUs
    why = nccl.decide(_rows((1, 7, 0), (1, 7, 1), (1, 7, 0)))
    assert why is not None and "ranks 0 and 2" in why and "GPU 0" in why
    why = nccl.decide(_rows((1, 7, 0), (0, 8, -1), (0, 9, -1)))
    assert why is not None and why.startswith("ranks 1, 2 have no GPU")

