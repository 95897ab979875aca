// Softmax and the softmax cross-entropy, fused: one block per row of a rows x cols matrix of logits.
//
//   softmax(z)[j]      = exp(z[j] - m) / sum_k exp(z[k] - m),    m = max_k z[k]
//   loss               = log(sum_k exp(z[k] - m)) + m - z[label]   (= -log softmax(z)[label])
//   d loss / d z[j]    = softmax(z)[j] - (j == label)
//
// Subtracting the row's maximum m first keeps exp() from overflowing: the largest term is exp(0).
// The forward kernel writes the probabilities it computed, so the backward kernel needs no exp():
// training computes exp() once per step, as TensorFlow's fused kernel does.
//
// Each row is reduced twice (its max, then its sum of exps) by the same two-phase pattern as
// reduce.cu: strided loads into registers, then a tree in shared memory. Both reductions are
// __device__ functions that every thread of the block calls (they contain __syncthreads, so all
// threads must reach them). The block size must be a power of two, at most BLOCK.
//
// A label outside [0, cols) gives a NaN loss and NaN gradients for its row (as TensorFlow does on
// a GPU) rather than a read outside the row: a kernel cannot raise an exception.
//
// Launch: grid = (rows,), block = (a power of two <= BLOCK,), e.g. 32 for 10 classes.

#define BLOCK 256
#define LOWEST (-3.402823466e38f)       // the most negative float: the identity of max()

// The largest z[j] of the row, in every thread: strided loads, then a tree in shared memory.
__device__ float row_max(const float* z, int cols, float* scratch)
{
    int tid = threadIdx.x;
    float m = LOWEST;
    for (int j = tid; j < cols; j += blockDim.x) {
        m = fmaxf(m, z[j]);
    }
    scratch[tid] = m;
    __syncthreads();
    for (int active = blockDim.x / 2; active > 0; active /= 2) {
        if (tid < active) {
            scratch[tid] = fmaxf(scratch[tid], scratch[tid + active]);
        }
        __syncthreads();
    }
    m = scratch[0];
    __syncthreads();                   // everyone has read scratch[0] before it is overwritten
    return m;
}

// The sum of exp(z[j] - m) over the row, in every thread, the same way.
__device__ float row_sum_exp(const float* z, int cols, float m, float* scratch)
{
    int tid = threadIdx.x;
    float total = 0.0f;
    for (int j = tid; j < cols; j += blockDim.x) {
        total += expf(z[j] - m);
    }
    scratch[tid] = total;
    __syncthreads();
    for (int active = blockDim.x / 2; active > 0; active /= 2) {
        if (tid < active) {
            scratch[tid] += scratch[tid + active];
        }
        __syncthreads();
    }
    total = scratch[0];
    __syncthreads();
    return total;
}

extern "C" __global__
void softmax_rows(const float* logits, float* probs, int rows, int cols)
{
    __shared__ float scratch[BLOCK];
    int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* z = logits + row * cols;   // this block's row
    float m = row_max(z, cols, scratch);
    float total = row_sum_exp(z, cols, m, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        probs[row * cols + j] = expf(z[j] - m) / total;
    }
}

extern "C" __global__
void softmax_xent_forward(const float* logits, const int* labels, float* probs, float* loss,
                          int rows, int cols)
{
    __shared__ float scratch[BLOCK];
    int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* z = logits + row * cols;   // this block's row
    float m = row_max(z, cols, scratch);
    float total = row_sum_exp(z, cols, m, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        probs[row * cols + j] = expf(z[j] - m) / total;
    }

    // the loss, by one thread: log(total) + m - z[label] = -log(probs[label])
    if (threadIdx.x == 0) {
        int label = labels[row];
        if (label >= 0 && label < cols) {
            loss[row] = logf(total) + m - z[label];
        } else {
            loss[row] = logf(-1.0f);   // NaN: an invalid label
        }
    }
}

extern "C" __global__
void softmax_xent_backward(const float* probs, const int* labels, const float* dloss, float* dlogits,
                           int rows, int cols)
{
    int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    int label = labels[row];
    float g = dloss[row];
    if (label < 0 || label >= cols) {
        g = logf(-1.0f);               // NaN: an invalid label poisons its row, as in the forward
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float hot = (j == label) ? 1.0f : 0.0f;
        dlogits[row * cols + j] = (probs[row * cols + j] - hot) * g;
    }
}
