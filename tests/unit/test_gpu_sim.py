"""The CUDA C simulator (flowlab/gpu/_sim.py): kernels as a learner writes them for CuPy's RawKernel,
run on the CPU thread by thread, checked against numpy; and each report triggered by a real bug."""
import numpy as np
import pytest

from flowlab.gpu._sim import (DivergentBarrierError, KernelArgumentError, KernelFault, KernelSourceError,
                              KernelTimeoutError, OutOfBoundsError, RaceError, parse_kernels, simulate)

VECTOR_ADD = r'''
extern "C" __global__ void vec_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
'''

GRID_STRIDE_SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    // a grid-stride loop: any grid covers any n
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = a * x[i] + y[i];
    }
}
'''

REDUCE = r'''
#define BLOCK 64
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float partial[BLOCK];
    unsigned int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    partial[tid] = (i < n) ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            partial[tid] += partial[tid + s];
        }
        __syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = partial[0];
}
'''
REDUCE_NO_SYNC = REDUCE.replace("        __syncthreads();\n    }", "    }")

TILED_MATMUL = r'''
#define TILE 4
// C = A @ B for n x n matrices, one thread per element of C, tiles of A and B staged in shared memory
extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < n / TILE; ++t) {
        As[ty][tx] = A[row * n + t * TILE + tx];
        Bs[ty][tx] = B[(t * TILE + ty) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) {
            acc += As[ty][k] * Bs[k][tx];
        }
        __syncthreads();
    }
    C[row * n + col] = acc;
}
'''

NAIVE_MATMUL = r'''
extern "C" __global__ void matmul_naive(const float* A, const float* B, float* C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++) acc += A[row * n + k] * B[k * n + col];
        C[row * n + col] = acc;
    }
}
'''

OFF_BY_ONE = r'''
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) {
        x[i] = a * x[i];
    }
}
'''

DIVERGENT = r'''
extern "C" __global__ void shift_left(float* x) {
    __shared__ float buf[32];
    buf[threadIdx.x] = x[threadIdx.x];
    if (threadIdx.x < 16) {
        __syncthreads();
        x[threadIdx.x] = buf[threadIdx.x + 1];
    }
}
'''

ENDLESS = r'''
extern "C" __global__ void spin(int* flag) {
    int i = 0;
    while (flag[0] == 0) {   // nobody ever sets the flag
        i++;
    }
}
'''

INT_ARITH = r'''
extern "C" __global__ void int_ops(const int* a, const int* b, int* quot, int* rem, unsigned int* wrapped) {
    int i = threadIdx.x;
    quot[i] = a[i] / b[i];
    rem[i] = a[i] % b[i];
    wrapped[i] = threadIdx.x - 2;     // unsigned arithmetic wraps around
}
'''

SOFTMAX = r'''
extern "C" __global__ void row_softmax(const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;     /* pointer arithmetic: this thread's row */
    float* out = y + r * cols;
    float m = row[0];
    for (int j = 1; j < cols; j++) m = fmaxf(m, row[j]);
    float total = 0.f;
    for (int j = 0; j < cols; j++) {
        float e = expf(row[j] - m);
        out[j] = e;
        total += e;
    }
    for (int j = 0; j < cols; j++) out[j] /= total;
}
'''

HISTOGRAM = r'''
extern "C" __global__ void histogram(const int* values, int* bins, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int b = values[i] % nbins;
        atomicAdd(&bins[b], 1);
    }
}
'''

TEMPLATE = r'''
template <typename T>
__global__ void add_one(T* x) {
    x[threadIdx.x] += 1;
}
'''

RACY_GLOBAL = r'''
extern "C" __global__ void last_wins(const float* x, float* out) {
    out[0] = x[blockIdx.x * blockDim.x + threadIdx.x];   // every thread writes one element
}
'''

LANGUAGE = r'''
#define SQ(v) ((v) * (v))
#ifndef WIDTH
#define WIDTH 4
#endif
extern "C" {
__device__ __forceinline__ float clampf(float v, float lo, float hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}
__device__ float block_total(float* s, float v) {
    s[threadIdx.x] = v;
    __syncthreads();
    float t = 0.0f;
    for (int k = 0; k < blockDim.x; k++) t += s[k];
    __syncthreads();
    return t;
}
__global__ void features(const float* x, float* out, int* iout, unsigned int seed) {
    extern __shared__ float scratch[];
    __shared__ int counter;
    int i = threadIdx.x;
    if (i == 0) counter = 0;
    __syncthreads();
    float local[WIDTH];
    for (int k = 0; k < WIDTH; k++) local[k] = (float)k * 0.5f;
    int odd = 0, k = 0;
    do {
        k++;
        if (k % 2 == 0) continue;
        odd += k;
    } while (k < 7);
    int evens = 0;
    for (int j = 0; j < 10; j++) {
        if (j & 1) continue;
        evens++;
    }
    int m = 0;
    int idx[3];
    idx[m++] = 5; idx[m++] = 6; idx[m] = 7;
    unsigned int h = seed * 1664525u + 1013904223u;
    h ^= h >> 16;
    const float* p = x + i;
    float first = *p++;
    float second = *p;
    float total = block_total(scratch, x[i]);
    atomicAdd(&counter, 1);
    __syncthreads();
    out[i * WIDTH + 0] = clampf(x[i], -0.5f, 0.5f);
    out[i * WIDTH + 1] = SQ(x[i]) + local[3];
    out[i * WIDTH + 2] = total;
    out[i * WIDTH + 3] = (i > 0 && x[i - 1] > 0.0f) ? sqrtf(fabsf(x[i - 1])) : -1.0f;
    iout[i * 6 + 0] = odd;
    iout[i * 6 + 1] = evens;
    iout[i * 6 + 2] = idx[0] + idx[1] * 10 + idx[2] * 100 + m * 1000;
    iout[i * 6 + 3] = (int)(h & 0xFFFF);
    iout[i * 6 + 4] = counter + (int)(first - x[i]) + (second == x[i + 1] ? 100 : 0);
    iout[i * 6 + 5] = -17 >> 2;
}
}
'''

TILE_OOB = r'''
__global__ void shift_tile(float* out) {
    const int T = 4;
    __shared__ float tile[T][T];
    tile[threadIdx.y][threadIdx.x + 1] = 1.0f;    // the last column writes past its row
    out[0] = 0.0f;
}
'''

SIMULATED = [LANGUAGE, TILE_OOB, VECTOR_ADD, GRID_STRIDE_SAXPY, REDUCE, REDUCE_NO_SYNC, TILED_MATMUL, NAIVE_MATMUL, OFF_BY_ONE,
             DIVERGENT, ENDLESS, INT_ARITH, SOFTMAX, HISTOGRAM, RACY_GLOBAL]


def test_vector_add_matches_numpy_and_counts_accesses():
    rng = np.random.default_rng(0)
    n = 100
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    c = np.zeros(n, np.float32)
    report = simulate(VECTOR_ADD, "vec_add", grid=(n + 31) // 32, block=32, args=[a, b, c, n])
    np.testing.assert_array_equal(c, a + b)
    assert report.threads == 128 and report.blocks == 4 and report.ok
    assert report.global_loads == {"a": n, "b": n, "c": 0} and report.global_stores["c"] == n
    assert report.global_bytes == 3 * n * 4
    assert "vec_add" in str(report) and "races: none" in str(report)


def test_grid_stride_loop_covers_more_elements_than_threads():
    rng = np.random.default_rng(1)
    n = 300
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    expected = np.float32(2.5) * x + y
    report = simulate(GRID_STRIDE_SAXPY, "saxpy", grid=2, block=32, args=[np.float32(2.5), x, y, n])
    np.testing.assert_allclose(y, expected, rtol=1e-5)   # a*x+y rounded once, as a GPU's fused multiply-add
    assert report.threads == 64 and report.global_stores["y"] == n


def test_shared_memory_reduction_is_right_and_race_free():
    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    out = np.zeros(64, np.float32)
    report = simulate(REDUCE, "block_sum", grid=64, block=64, args=[x, out, x.size])
    np.testing.assert_allclose(out, x.reshape(64, 64).sum(axis=1), rtol=1e-4, atol=1e-5)
    assert report.ok, report.races
    assert report.barriers == 64 * 7                 # one before the loop, six in it, per block
    assert report.shared_stores["partial"] == 64 * (64 + 63)


def test_reduction_without_syncthreads_reports_a_shared_race_with_both_lines():
    x = np.ones(64, np.float32)
    out = np.zeros(1, np.float32)
    report = simulate(REDUCE_NO_SYNC, "block_sum", grid=1, block=64, args=[x, out, 64])
    assert not report.ok
    shared = [r for r in report.races if r.array == "partial"]
    assert shared and {r.kind for r in shared} <= {"read-write", "write-write"}
    lines = REDUCE_NO_SYNC.split("\n")
    race = shared[0]
    assert "partial[tid] += partial[tid + s]" in lines[race.second[2] - 1]
    assert race.first[1] != race.second[1]                       # two different threads
    assert "RACE" in str(report)
    with pytest.raises(RaceError, match=r"partial\[\d+\].*threadIdx=\(\d+, 0, 0\)"):
        simulate(REDUCE_NO_SYNC, "block_sum", grid=1, block=64, args=[x, out, 64], races="raise")


def test_tiled_matmul_is_right_and_loads_fewer_than_naive():
    n, tile = 16, 4
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    C = np.zeros((n, n), np.float32)
    tiled = simulate(TILED_MATMUL, "matmul_tiled", grid=(n // tile, n // tile), block=(tile, tile), args=[A, B, C, n])
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
    assert tiled.ok, tiled.races
    # each thread loads one element of A and one of B per tile step: n*n threads * (n/TILE) steps
    assert tiled.global_loads == {"A": n * n * n // tile, "B": n * n * n // tile, "C": 0}
    assert tiled.shared_loads == {"As": n * n * n, "Bs": n * n * n}
    C2 = np.zeros((n, n), np.float32)
    naive = simulate(NAIVE_MATMUL, "matmul_naive", grid=(2, 2), block=(8, 8), args=[A, B, C2, n])
    np.testing.assert_allclose(C2, A @ B, rtol=1e-4, atol=1e-4)
    assert naive.global_loads == {"A": n ** 3, "B": n ** 3, "C": 0}   # n loads of each per output element
    assert tiled.global_loads["A"] * tile == naive.global_loads["A"]


def test_off_by_one_bound_raises_out_of_bounds_naming_thread_and_line():
    x = np.ones(40, np.float32)
    with pytest.raises(OutOfBoundsError) as info:
        simulate(OFF_BY_ONE, "scale", grid=2, block=32, args=[x, np.float32(2), 40])
    e = info.value
    assert (e.thread, e.block, e.array, e.index, e.size) == ((8, 0, 0), (1, 0, 0), "x", 40, 40)
    assert e.line == 5 and "x[i] = a * x[i];" in str(e) and "threadIdx=(8, 0, 0)" in str(e)
    assert isinstance(e, KernelFault) and isinstance(e, RuntimeError)


def test_syncthreads_inside_an_if_is_a_divergent_barrier():
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(DivergentBarrierError, match=r"line 6.*__syncthreads\(\)") as info:
        simulate(DIVERGENT, "shift_left", grid=1, block=32, args=[x])
    assert "already returned" in str(info.value) and "hang" in str(info.value)


def test_endless_loop_times_out_naming_a_thread():
    with pytest.raises(KernelTimeoutError, match=r"threadIdx=\(0, 0, 0\).*line 4") as info:
        simulate(ENDLESS, "spin", grid=1, block=4, args=[np.zeros(1, np.int32)], max_steps=2000)
    assert "endless loop" in str(info.value)


def test_arguments_are_checked_like_a_launch():
    a = np.zeros(8, np.float32)
    with pytest.raises(KernelArgumentError, match="takes 4 arguments"):
        simulate(VECTOR_ADD, "vec_add", 1, 8, [a, a, a])
    with pytest.raises(KernelArgumentError, match="float32.*not float64"):
        simulate(VECTOR_ADD, "vec_add", 1, 8, [a, a, np.zeros(8), 8])
    with pytest.raises(KernelArgumentError, match="not contiguous"):
        simulate(VECTOR_ADD, "vec_add", 1, 8, [a, a, np.zeros(16, np.float32)[::2], 8])
    with pytest.raises(KernelArgumentError, match="scalar"):
        simulate(VECTOR_ADD, "vec_add", 1, 8, [a, a, a, np.array([8])])
    with pytest.raises(KernelArgumentError, match="double"):            # CuPy would pass 8 bytes
        simulate(GRID_STRIDE_SAXPY, "saxpy", 1, 8, [2.5, a, a, 8])
    with pytest.raises(KernelArgumentError, match="1024"):
        simulate(VECTOR_ADD, "vec_add", 1, 2048, [a, a, a, 8])
    with pytest.raises(KernelArgumentError, match="smaller size"):
        simulate(VECTOR_ADD, "vec_add", 1000, 1024, [a, a, a, 8])
    with pytest.raises(KernelArgumentError, match="vec_add"):
        simulate(VECTOR_ADD, "vec_sub", 1, 8, [a, a, a, 8])


def test_integer_division_and_modulo_truncate_toward_zero():
    a = np.array([7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    quot, rem, wrapped = np.zeros(6, np.int32), np.zeros(6, np.int32), np.zeros(6, np.uint32)
    simulate(INT_ARITH, "int_ops", 1, 6, [a, b, quot, rem, wrapped])
    np.testing.assert_array_equal(quot, np.trunc(a / b).astype(np.int32))   # C, not Python's floor
    np.testing.assert_array_equal(rem, np.fmod(a, b))
    np.testing.assert_array_equal(wrapped, (np.arange(6, dtype=np.uint32) - np.uint32(2)))
    b[4] = 0
    with pytest.raises(KernelFault, match=r"division by zero.*|threadIdx=\(4, 0, 0\)"):
        simulate(INT_ARITH, "int_ops", 1, 6, [a, b, quot, rem, wrapped])


def test_row_softmax_with_pointer_arithmetic():
    x = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)
    y = np.zeros_like(x)
    report = simulate(SOFTMAX, "row_softmax", grid=1, block=8, args=[x, y, 5, 7])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    assert report.global_loads["x"] == 5 * 7 * 2 and report.ok


def test_atomic_histogram_is_right_and_race_free():
    values = np.random.default_rng(5).integers(0, 100, 200).astype(np.int32)
    bins = np.zeros(8, np.int32)
    report = simulate(HISTOGRAM, "histogram", grid=4, block=64, args=[values, bins, values.size, 8])
    np.testing.assert_array_equal(bins, np.bincount(values % 8, minlength=8))
    assert report.ok


def test_threads_of_different_blocks_writing_one_element_race():
    out = np.zeros(1, np.float32)
    report = simulate(RACY_GLOBAL, "last_wins", grid=2, block=4, args=[np.arange(8, dtype=np.float32), out])
    kinds = {(r.array, r.kind) for r in report.races}
    assert kinds == {("out", "write-write")}
    assert len(report.races) == 1                      # once per (array, kind, lines)


def test_template_is_a_source_error_with_its_line():
    with pytest.raises(KernelSourceError, match="line 2.*template") as info:
        simulate(TEMPLATE, "add_one", 1, 4, [np.zeros(4, np.float32)])
    assert info.value.lineno == 2
    with pytest.raises(KernelSourceError, match="line 3"):
        parse_kernels("__global__ void k(float* x) {\n  int i = 0;\n  float& r = x[i];\n}\n")


def test_parse_kernels_lists_parameters():
    assert parse_kernels(HISTOGRAM) == {"histogram": [("values", "int", True), ("bins", "int", True),
                                                      ("n", "int", False), ("nbins", "int", False)]}


def test_every_simulated_kernel_is_real_cuda_c():
    from flowlab.gpu import compile_check, nvrtc_available
    if not nvrtc_available():
        pytest.skip("NVRTC (pip install nvidia-cuda-nvrtc) is not installed")
    # one NVRTC run for all (names made unique), as a compile costs a fraction of a second
    sources = [src.replace("block_sum", f"block_sum_{i}") for i, src in enumerate(SIMULATED)]
    report = compile_check("\n".join(sources), "sim_kernels.cu")
    assert len(report.kernels) == len(SIMULATED)


def test_language_features_have_c_semantics():
    """Device functions (one with a barrier), do-while and for with continue, a[i++], pointer ++,
    unsigned wrap-around, >> of a negative, dynamic shared memory, local arrays, macros, atomics."""
    n = 8
    x = np.random.default_rng(6).standard_normal(n + 1).astype(np.float32)
    out, iout = np.zeros((n, 4), np.float32), np.zeros((n, 6), np.int32)
    report = simulate(LANGUAGE, "features", 1, n, [x, out, iout, 12345], shared_mem=n * 4)
    assert report.ok and report.barriers == 4
    h = (12345 * 1664525 + 1013904223) % 2 ** 32
    h ^= h >> 16
    xs = x[:n].astype(np.float64)
    np.testing.assert_allclose(out[:, 0], np.clip(xs, -0.5, 0.5))
    np.testing.assert_allclose(out[:, 1], xs ** 2 + 1.5, rtol=1e-6)
    np.testing.assert_allclose(out[:, 2], xs.sum(), rtol=1e-5)
    np.testing.assert_allclose(out[1:, 3], np.where(xs[:-1] > 0, np.sqrt(np.abs(xs[:-1])), -1), rtol=1e-6)
    assert out[0, 3] == -1
    assert iout.tolist() == [[1 + 3 + 5 + 7, 5, 5 + 60 + 700 + 2000, h & 0xFFFF, n + 100, -5]] * n


def test_out_of_bounds_in_a_2d_shared_array_names_both_indices():
    with pytest.raises(OutOfBoundsError, match=r"tile\[0\]\[4\].*tile\[4\]\[4\]") as info:
        simulate(TILE_OOB, "shift_tile", 1, (4, 4), [np.zeros(1, np.float32)])
    assert info.value.index_nd == (0, 4) and info.value.thread == (3, 0, 0) and info.value.line == 5


STRIDED_COPY = r'''
extern "C" __global__ void copy(const float* x, float* y, int stride, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i * stride];            // stride 1: neighbours read neighbours
}
'''
SIMULATED.append(STRIDED_COPY)                  # compiled by test_every_simulated_kernel_is_real_cuda_c


def test_transactions_count_sectors_per_warp_request_coalesced_vs_strided():
    n = 64
    x, y = np.arange(n * 32, dtype=np.float32), np.zeros(n, np.float32)
    plain = simulate(STRIDED_COPY, "copy", 2, 32, [x, y, 1, n])
    assert plain.transactions == {}                                  # opt-in: counting costs time
    report = simulate(STRIDED_COPY, "copy", 2, 32, [x, y, 1, n], transactions=True)
    assert report.transactions["x"] == {"loads": 8, "stores": 0, "requests": 2, "ideal": 8, "elements": 64}
    assert report.transactions["y"]["stores"] == 8                  # 32 floats = 128 bytes = 4 sectors per warp
    strided = simulate(STRIDED_COPY, "copy", 2, 32, [x, y, 32, n], transactions=True)
    np.testing.assert_array_equal(y, x[::32])
    assert strided.transactions["x"]["loads"] == 64                 # every thread its own sector
    table = strided.coalescing()
    assert "strided: 8.0x" in table and "32.0" in table
    assert "coalesced" in report.coalescing() and "strided" not in report.coalescing()
    assert str(strided) == str(simulate(STRIDED_COPY, "copy", 2, 32, [x, y, 32, n]))   # str is unchanged


def test_naive_matmul_reads_b_coalesced_and_a_as_a_broadcast():
    n = 32                                      # one warp = one row of 32 outputs
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    C = np.zeros((n, n), np.float32)
    report = simulate(NAIVE_MATMUL, "matmul_naive", grid=(1, 2), block=(32, 1), args=[A, B, C, n], transactions=True)
    np.testing.assert_allclose(C[:2], (A @ B)[:2], rtol=1e-4, atol=1e-4)
    a, b = report.transactions["A"], report.transactions["B"]
    assert a["requests"] == b["requests"] == 2 * n                 # 2 warps x n steps of k
    assert a["loads"] == a["requests"] and a["elements"] == a["requests"]   # one element, one sector
    assert b["loads"] == 4 * b["requests"]
    rows = {line.split()[0]: line for line in report.coalescing().split("\n")[2:]}
    assert "broadcast" in rows["A"] and "coalesced" in rows["B"]


def test_report_html_has_the_counts_transactions_and_both_sides_of_a_race():
    out = np.zeros(1, np.float32)
    report = simulate(RACY_GLOBAL, "last_wins", grid=2, block=4, args=[np.arange(8, dtype=np.float32), out],
                      transactions=True)
    page = report._repr_html_()
    assert page.startswith("<div") and "<script" not in page and "&lt;&lt;&lt;2, 4&gt;&gt;&gt;" in page
    assert "<th>sectors/request</th>" in page and "write-write" in page
    race = report.races[0]
    for access in (race.first, race.second):
        assert f"threadIdx={access[1]} blockIdx={access[0]}" in page
    assert page.count(f"line {race.second[2]}: ") == 2                 # both threads' line, with its text
