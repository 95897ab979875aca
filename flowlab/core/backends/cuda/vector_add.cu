// vector_add: c = a + b, one float per element.
//
// The first kernel to read. Every thread runs this same function; the only thing that differs
// between threads is their index (blockIdx, threadIdx). A thread finds "its" element from them.
//
// The loop is a grid-stride loop: a thread handles element i, then i + (all the threads of the
// grid), and so on. So any grid size works for any n: a small grid loops more, a large one less,
// and threads whose first i is already past n do nothing at all.
//
// Launch: grid = (blocks,), block = (threads,), e.g. grid = (ceil(n / 256),), block = (256,).

extern "C" __global__
void vector_add(const float* a, const float* b, float* c, int n)
{
    int first = blockIdx.x * blockDim.x + threadIdx.x;   // this thread's place in the whole grid
    int stride = gridDim.x * blockDim.x;                 // how many threads the grid has
    for (int i = first; i < n; i += stride) {
        c[i] = a[i] + b[i];
    }
}
