"""Large collective results come from recycled blocks (flowlab/cluster/_buffers.py):
a block is reused only once no array made from it is alive, so results the caller keeps never
change."""
import threading

import numpy as np

from flowlab.cluster import _buffers
from flowlab.cluster.collectives import LocalGroup, allgather, allreduce


def _addr(a):
    return a.__array_interface__["data"][0]


def test_a_block_is_reused_only_when_every_array_made_from_it_is_gone():
    a = _buffers.empty(1 << 18, np.float32)
    where = _addr(a)
    view = a.reshape(2, -1)[1]           # a view of a view still holds the block
    del a
    b = _buffers.empty(1 << 18, np.float32)
    assert _addr(b) != where and not np.shares_memory(b, view)
    del view
    c = _buffers.empty(1 << 18, np.float32)
    assert _addr(c) == where
    small = _buffers.empty(10, np.float64)
    assert small.base is None            # below MIN_BYTES: plain memory


def test_results_that_are_kept_never_change_across_later_calls():
    x = np.arange(1 << 18, dtype=np.float32)          # 1 MiB: pooled results

    def body(comm):
        kept = [allreduce(x * (i + 1)) for i in range(4)]
        gathered = allgather(x[:1 << 17] + comm.rank)
        again = [allreduce(x) for _ in range(3)]
        return kept, gathered, again

    with LocalGroup(2) as group:
        out = group.run(body)
    for kept, gathered, again in out:
        for i, k in enumerate(kept):
            np.testing.assert_array_equal(k, 2 * (i + 1) * x)
        np.testing.assert_array_equal(gathered, np.concatenate([x[:1 << 17], x[:1 << 17] + 1]))
        assert all(np.array_equal(a, 2 * x) for a in again)


def test_threads_never_get_the_same_block():
    got, lock = [], threading.Lock()

    def take():
        arrs = [_buffers.empty(1 << 18, np.float32) for _ in range(20)]
        with lock:
            got.extend(arrs)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len({_addr(a) for a in got}) == len(got) == 80
