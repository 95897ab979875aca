"""block-sum (exercises/14_block_sum.ipynb, checks/block_sum.py): the reference kernel passes every
case, visible and hidden, in the simulator; the learner's usual mistakes each fail, on the check that
names them (a race, a load past n, a serial sum, a store per thread, a barrier inside the if)."""
import sys
from pathlib import Path

import flowlab as fl

sys.path.insert(0, str(Path(__file__).parent))
from _grade import failures, outcomes   # noqa: E402

ID = "block-sum"

TEMPLATE = r"""
extern "C" __global__
void block_sum(const float* x, float* partial, int n)
{
    __shared__ float s[256];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    LOAD
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) {
            s[t] += s[t + stride];
        }
        SYNC
    }
    STORE
}
"""
PARTS = {"LOAD": "s[t] = (i < n) ? x[i] : 0.0f;", "SYNC": "__syncthreads();",
         "STORE": "if (t == 0) { partial[blockIdx.x] = s[0]; }"}


def kernel(**changes):
    src = TEMPLATE
    for key, default in PARTS.items():
        src = src.replace(key, changes.get(key, default))
    return src


def test_the_reference_passes_every_case_and_compiles():
    results = outcomes(ID, kernel())
    assert len(results) == 8
    assert all(ok for _, ok, _ in results), results
    assert fl.gpu.Kernel(kernel(), "block_sum").compile().kernels["block_sum"].shared_bytes == 1024


def test_a_missing_barrier_in_the_loop_is_a_race():
    failed = dict(failures(ID, kernel(SYNC="")))
    assert len(failed) == 8
    why = failed["n = 1024: four full blocks"]
    assert why.startswith("at ['races']: expected 'none', got 'read-write race on s[")
    assert "at line 12 (s[t] += s[t + stride];)" in why


def test_loading_past_n_is_out_of_bounds_with_the_thread():
    failed = dict(failures(ID, kernel(LOAD="s[t] = x[i];")))
    assert "n = 1024: four full blocks" not in failed                  # a full last block never reads past n
    why = failed["n = 1000: the last block is part full (zeros past n)"]
    assert "OutOfBoundsError" in why and "x[1000]" in why and "threadIdx=(232, 0, 0)" in why


def test_every_thread_storing_the_total_races_on_partial():
    [(name, ok, why)] = [o for o in outcomes(ID, kernel(STORE="partial[blockIdx.x] = s[0];"), hidden=False)
                         if o[0] == "n = 1024: four full blocks"]
    assert not ok and "write-write race on partial[0]" in why


def test_thread_0_storing_twice_is_one_store_too_many():
    twice = kernel(STORE="if (t == 0) { partial[blockIdx.x] = 0.0f; partial[blockIdx.x] = s[0]; }")
    why = dict(failures(ID, twice))["n = 1024: four full blocks"]
    assert why == "at ['global stores to partial']: expected 4, got 8"


def test_a_serial_sum_by_thread_0_is_not_a_tree():
    serial = r"""
    extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
        if (threadIdx.x == 0) {
            float acc = 0.0f;
            for (int k = 0; k < 256; k++) {
                int i = blockIdx.x * 256 + k;
                if (i < n) acc += x[i];
            }
            partial[blockIdx.x] = acc;
        }
    }"""
    failed = dict(failures(ID, serial))
    assert len(failed) == 8
    assert all("a tree in shared memory" in why and "0 barrier phase(s) per block" in why for why in failed.values())


def test_a_barrier_inside_the_if_is_divergent():
    src = kernel(SYNC="").replace("s[t] += s[t + stride];", "s[t] += s[t + stride];\n            __syncthreads();")
    why = dict(failures(ID, src))["n = 1"]
    assert "DivergentBarrierError" in why and "__syncthreads" in why


def test_loading_x_twice_is_counted():
    twice = kernel(LOAD="s[t] = (i < n) ? x[i] : 0.0f;\n    float again = (i < n) ? x[i] : 0.0f;")
    why = dict(failures(ID, twice))["n = 100: less than one block"]
    assert "global loads of x" in why and "expected 100, got 200" in why


def test_not_a_string_or_the_wrong_signature_says_so():
    why = dict(failures(ID, lambda x: x))["n = 1"]
    assert "must be a string of CUDA C" in why
    wrong = kernel().replace("int n)", "float n)")
    assert "must take (const float* x, float* partial, int n)" in dict(failures(ID, wrong))["n = 1"]


def test_a_kernel_that_only_the_simulator_takes_fails_on_compiling_for_a_real_gpu():
    if not fl.gpu.nvrtc_available():
        import pytest
        pytest.skip("NVRTC (nvidia-cuda-nvrtc) is not installed")
    failed = dict(failures(ID, kernel().replace('extern "C" __global__', "__global__")))   # CuPy finds no 'block_sum'
    why = failed["n = 1024: four full blocks"]
    assert why.startswith("at ['compiles for a real GPU (NVRTC)']: expected 'yes', got 'no: no kernel named block_sum"), why
