"""The alpha-beta cost model (flowlab.cluster.collectives.cost): steps and bytes on the busiest
link per algorithm against hand-counted cases and against what real recorded all-reduces did,
nccl-tests' bus-bandwidth factors, and alpha/beta fitted on this machine."""
import math

import numpy as np
import pytest

from flowlab.cluster.collectives import LocalGroup, allreduce, barrier, cost

MiB = 1 << 20


@pytest.mark.parametrize("algorithm, n, steps, bytes_", [
    ("naive", 4, 2, 6 * MiB), ("ring", 4, 6, 3 * MiB // 2), ("tree", 4, 4, 3 * MiB // 2),
    ("naive", 2, 2, 2 * MiB), ("ring", 2, 2, MiB), ("tree", 2, 2, MiB),
    ("ring", 8, 14, 7 * MiB // 4), ("tree", 8, 6, 7 * MiB // 4), ("naive", 8, 2, 14 * MiB),
    ("tree", 3, 4, 3 * MiB + MiB // 3), ("tree", 5, 6, 4 * MiB),
    ("ring", 1, 0, 0), ("tree", 1, 0, 0), ("naive", 1, 0, 0)])
def test_steps_and_bytes_of_known_cases(algorithm, n, steps, bytes_):
    assert cost.steps(algorithm, n) == steps
    assert abs(cost.bytes_on_busiest_link(algorithm, n, MiB) - bytes_) <= 1


def _counted(algorithm, n, nbytes):
    """(steps, busiest-link bytes) of a real all-reduce, counted from its events as lesson 09 does."""
    def body(comm):
        barrier()
        allreduce(np.ones(nbytes // 4, np.float32), algorithm=algorithm)
    with LocalGroup(n) as g:
        g.run(body)
        evs = [e for e in g.events.events() if e.name == "allreduce" and e.kind in ("send", "recv")]
    steps = len({e.attrs["step"] for e in evs})
    per = {}
    for e in evs:
        per.setdefault((e.rank, e.attrs["step"]), [0, 0])[e.kind == "recv"] += e.bytes
    load = {}
    for (rank, _), (sent, got) in per.items():
        load[rank] = load.get(rank, 0) + max(sent, got)
    return steps, max(load.values())


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("algorithm", ["naive", "ring", "tree"])
def test_the_model_counts_what_real_allreduces_do(algorithm, n):
    nbytes = 48 * 1024
    steps, busiest = _counted(algorithm, n, nbytes)
    assert cost.steps(algorithm, n) == steps
    # chunks differ by at most one float32 element when n does not divide the tensor
    assert abs(cost.bytes_on_busiest_link(algorithm, n, nbytes) - busiest) <= 4 * 2 * steps


def test_predict_is_steps_times_alpha_plus_bytes_times_beta():
    assert cost.predict("ring", 4, MiB, 1e-5, 1e-9) == pytest.approx(6 * 1e-5 + 1.5 * MiB * 1e-9)
    assert cost.AlphaBeta(1e-5, 1e-9).predict("naive", 4, MiB) == pytest.approx(2e-5 + 6 * MiB * 1e-9)


def test_bus_bandwidth_follows_nccl_tests():
    assert cost.busbw_factor("allreduce", 4) == 1.5
    assert cost.busbw_factor("allreduce", 8) == 1.75
    assert cost.busbw_factor("allgather", 4) == 0.75
    assert cost.busbw_factor("reduce_scatter", 2) == 0.5
    assert cost.busbw_factor("broadcast", 8) == 1.0
    assert cost.algbw(MiB, 1e-3) == MiB / 1e-3
    assert cost.busbw("allreduce", 4, MiB, 1e-3) == pytest.approx(1.5 * MiB / 1e-3)
    assert cost.busbw_factor.formulas["allreduce"] == "2(n-1)/n"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="'butterfly'"):
        cost.steps("butterfly", 4)
    with pytest.raises(ValueError, match="positive integer"):
        cost.steps("ring", 0)
    with pytest.raises(ValueError, match="no bus-bandwidth factor for 'alltoall'"):
        cost.busbw_factor("alltoall", 4)
    with pytest.raises(ValueError, match="positive time"):
        cost.algbw(10, 0.0)


def test_alpha_and_beta_fitted_on_this_machine():
    ab = cost.fit_alpha_beta(large=MiB, repeats=3)
    assert 0 < ab.alpha < 0.05                   # one tiny message: well under 50 ms even under load
    assert 0 <= ab.beta < 1e-6 and math.isfinite(ab.beta)
    assert "alpha=" in repr(ab)
