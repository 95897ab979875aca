// C = A @ B for row-major float matrices: A is M x K, B is K x N, C is M x N.
//
// Two kernels, one thread per element of C, to compare:
//
// matmul_naive reads a whole row of A and a whole column of B from global memory for every
// element of C: 2 * K loads per thread, and each float of A is loaded N times over the grid.
//
// matmul_tiled has each TILE x TILE block of threads copy one tile of A and one tile of B into
// shared memory (one float per thread each), wait at a barrier, then multiply from shared memory:
// each float of A is loaded from global memory N / TILE times instead of N times. The second
// barrier of each step keeps a fast thread from overwriting a tile that others are still reading.
// Threads outside C still load (zeros past the edges) and reach both barriers: sizes need not be
// multiples of TILE.
//
// Launch both with block = (TILE, TILE), grid = (ceil(N / TILE), ceil(M / TILE)):
// x runs along the columns of C, y along its rows.

#define TILE 16

extern "C" __global__
void matmul_naive(const float* A, const float* B, float* C, int M, int N, int K)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            acc += A[row * K + k] * B[k * N + col];
        }
        C[row * N + col] = acc;
    }
}

extern "C" __global__
void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K)
{
    __shared__ float tile_a[TILE][TILE];
    __shared__ float tile_b[TILE][TILE];
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;

    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        // each thread copies one float of each tile; zeros where the tile hangs over an edge
        tile_a[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;
        tile_b[ty][tx] = (t + ty < K && col < N) ? B[(t + ty) * N + col] : 0.0f;
        __syncthreads();               // both tiles are complete

        for (int k = 0; k < TILE; k++) {
            acc += tile_a[ty][k] * tile_b[k][tx];
        }
        __syncthreads();               // everyone is done with these tiles before the next are loaded
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}
