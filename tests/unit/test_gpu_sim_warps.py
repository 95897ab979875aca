"""The CUDA C simulator's warp level (flowlab/gpu/_sim.py): shuffles, votes and __syncwarp as in
modern reductions, each checked against numpy with CUDA's rules for lanes and widths; and the error
for a warp-level call that not every thread of its mask reaches."""
import numpy as np
import pytest

from flowlab.gpu._sim import DivergentBarrierError, WarpSyncError, simulate

WARP_REDUCE = r'''
__device__ float warp_sum(float v) {
    for (int offset = warpSize / 2; offset > 0; offset /= 2)
        v += __shfl_down_sync(0xffffffff, v, offset);
    return v;                                   // lane 0 holds the warp's sum
}

extern "C" __global__ void block_sum_shfl(const float* x, float* warp_sums, float* out, int n) {
    __shared__ float partial[32];               // one sum per warp
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
    float v = warp_sum(i < n ? x[i] : 0.0f);
    if (lane == 0) {
        partial[warp] = v;
        warp_sums[blockIdx.x * (blockDim.x / warpSize) + warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < blockDim.x / warpSize ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) out[blockIdx.x] = v;
    }
}
'''

WARP_OPS = r'''
extern "C" __global__ void warp_ops(const int* x, int* out, unsigned int* votes) {
    int lane = threadIdx.x & 31;
    int v = x[threadIdx.x];
    unsigned int full = 0xffffffff;
    int* o = out + threadIdx.x * 8;
    o[0] = __shfl_sync(full, v, 3);             // everyone reads lane 3
    o[1] = __shfl_sync(full, v, lane + 33);     // lane numbers wrap: (lane + 1) % 32
    o[2] = __shfl_up_sync(full, v, 1);          // lane 0 keeps its own
    o[3] = __shfl_xor_sync(full, v, 1);         // swap with the neighbour
    o[4] = __shfl_down_sync(full, v, 4, 8);     // within segments of 8 lanes
    o[5] = __shfl_xor_sync(full, v, 8, 8);      // earlier segment readable, later gives own value
    o[6] = __any_sync(full, v > 60) + 2 * __all_sync(full, v >= 0);
    votes[threadIdx.x * 2] = __ballot_sync(full, v % 3 == 0);
    __syncwarp();
    if (lane < 12) {
        votes[threadIdx.x * 2 + 1] = __activemask();   // the lanes that took this branch
        o[7] = __shfl_up_sync(__activemask(), v, 2);
    }
}
'''

EARLY_RETURN = r'''
extern "C" __global__ void neighbour_sum(const float* x, float* y) {
    int lane = threadIdx.x % 32;
    float v = x[threadIdx.x];
    if (lane == 31) return;                      // the last lane leaves early ...
    v += __shfl_down_sync(0xffffffff, v, 1);     // ... but the mask still names it
    y[threadIdx.x] = v;
}
'''
MASK_LEAVES_CALLER_OUT = EARLY_RETURN.replace("    if (lane == 31) return;                      // the last lane leaves early ...\n", "") \
    .replace("0xffffffff", "0x7fffffff")


def test_warp_shuffle_reduction_per_warp_and_per_block_matches_numpy():
    n, block = 300, 128
    x = np.random.default_rng(10).standard_normal(n).astype(np.float32)
    warp_sums, out = np.zeros(12, np.float32), np.zeros(3, np.float32)
    report = simulate(WARP_REDUCE, "block_sum_shfl", grid=3, block=block, args=[x, warp_sums, out, n])
    padded = np.zeros(3 * block, np.float32)
    padded[:n] = x
    np.testing.assert_allclose(warp_sums, padded.reshape(12, 32).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, padded.reshape(3, block).sum(axis=1), rtol=1e-5, atol=1e-5)
    assert report.ok and report.barriers == 3 and report.shared_stores["partial"] == 12


def test_shuffles_and_votes_follow_cudas_lane_rules():
    nthreads = 64                                           # two warps
    x = np.random.default_rng(11).integers(0, 64, nthreads).astype(np.int32)
    out, votes = np.full((nthreads, 8), -1, np.int32), np.zeros((nthreads, 2), np.uint32)
    simulate(WARP_OPS, "warp_ops", 1, nthreads, [x, out, votes])
    lane = np.arange(nthreads) % 32
    base = np.arange(nthreads) - lane                       # thread index of lane 0 of each warp
    seg = lane - lane % 8
    np.testing.assert_array_equal(out[:, 0], x[base + 3])
    np.testing.assert_array_equal(out[:, 1], x[base + (lane + 1) % 32])
    np.testing.assert_array_equal(out[:, 2], np.where(lane >= 1, x[base + lane - 1], x))
    np.testing.assert_array_equal(out[:, 3], x[base + (lane ^ 1)])
    np.testing.assert_array_equal(out[:, 4], np.where(lane + 4 <= seg + 7, x[base + np.minimum(lane + 4, 31)], x))
    np.testing.assert_array_equal(out[:, 5], np.where((lane ^ 8) <= seg + 7, x[base + (lane ^ 8)], x))
    for w in range(2):
        xs = x[32 * w:32 * w + 32]
        rows = slice(32 * w, 32 * w + 32)
        assert (out[rows, 6] == int((xs > 60).any()) + 2 * int((xs >= 0).all())).all()
        assert (votes[rows, 0] == sum(1 << k for k in range(32) if xs[k] % 3 == 0)).all()
    assert (votes[lane < 12, 1] == 0xFFF).all() and (votes[lane >= 12, 1] == 0).all()
    np.testing.assert_array_equal(out[lane < 12, 7], np.where(lane >= 2, x[base + lane - 2], x)[lane < 12])
    assert (out[lane >= 12, 7] == -1).all()


def test_a_lane_of_the_mask_that_returned_early_is_a_warp_sync_error():
    with pytest.raises(WarpSyncError, match="not all threads in the mask reached __shfl_down_sync") as info:
        simulate(EARLY_RETURN, "neighbour_sum", 1, 32, [np.ones(32, np.float32), np.zeros(32, np.float32)])
    e = info.value
    assert e.lanes == [31] and e.line == 6 and e.mask == 0xFFFFFFFF and isinstance(e, DivergentBarrierError)
    assert "lane 31 already returned" in str(e) and "v += __shfl_down_sync" in str(e) and "lanes 0-30 wait" in str(e)


def test_a_mask_that_leaves_out_a_calling_lane_is_a_warp_sync_error():
    with pytest.raises(WarpSyncError, match=r"lane 31 calls __shfl_down_sync with mask 0x7fffffff") as info:
        simulate(MASK_LEAVES_CALLER_OUT, "neighbour_sum", 1, 32, [np.ones(32, np.float32), np.zeros(32, np.float32)])
    assert info.value.thread == (31, 0, 0) and info.value.line == 5


def test_warp_kernels_are_real_cuda_c():
    from flowlab.gpu import compile_check, nvrtc_available
    if not nvrtc_available():
        pytest.skip("NVRTC (pip install nvidia-cuda-nvrtc) is not installed")
    report = compile_check("\n".join([WARP_REDUCE, WARP_OPS, EARLY_RETURN]), "warp_kernels.cu")
    assert len(report.kernels) == 3
