// reduce_sum_rows: out[r] = x[r, 0] + x[r, 1] + ... + x[r, cols - 1], for a rows x cols matrix.
//
// One block sums one row, in two phases:
//   1. strided loads: thread t adds x[r, t], x[r, t + blockDim.x], ... into its own register,
//      so neighbouring threads read neighbouring floats (coalesced loads) and any cols works;
//   2. a tree in shared memory: at each step the first `active` threads add the partial sum
//      `active` slots above their own, halving what is left (log2(blockDim.x) steps), with a
//      barrier (__syncthreads) after each step so no thread reads a slot another has not written
//      yet. Thread 0 writes the total.
// The tree needs blockDim.x to be a power of two, at most BLOCK (the size of the shared array).
//
// Launch: grid = (rows,), block = (BLOCK,) or any smaller power of two.

#define BLOCK 256

extern "C" __global__
void reduce_sum_rows(const float* x, float* out, int rows, int cols)
{
    __shared__ float partial[BLOCK];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    if (row >= rows) {
        return;                        // the whole block leaves: no barrier is skipped by only some
    }

    // phase 1: each thread sums a strided slice of the row
    float sum = 0.0f;
    for (int j = tid; j < cols; j += blockDim.x) {
        sum += x[row * cols + j];
    }
    partial[tid] = sum;
    __syncthreads();

    // phase 2: halve the partial sums until one is left, in partial[0]
    for (int active = blockDim.x / 2; active > 0; active /= 2) {
        if (tid < active) {
            partial[tid] += partial[tid + active];
        }
        __syncthreads();               // outside the if: every thread of the block must reach it
    }
    if (tid == 0) {
        out[row] = partial[0];
    }
}
