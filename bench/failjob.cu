// failjob STEPS FAIL: STEPS steps of `scale` and `poke` on 4 MiB, a 4 KiB read-back every 5 steps;
// with FAIL=1 a last `poke` in which thread 17 of block 3 writes 256 GiB past the buffer.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale(float *x, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 1.0f;
}

__global__ void poke(float *x, int n, int bad_block, int bad_thread, long long far) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
    if ((int)blockIdx.x == bad_block && (int)threadIdx.x == bad_thread)
        x[far] = 42.0f;  // POKE_LINE
}

static void ck(cudaError_t e, const char *what) {
    if (e != cudaSuccess) { printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20, fail = argc > 2 ? atoi(argv[2]) : 1;
    const int n = 1 << 20, threads = 256, blocks = n / threads;
    float *h = (float *)malloc(n * sizeof(float)), *d = nullptr;
    for (int i = 0; i < n; i++) h[i] = (float)(i % 1000) * 0.001f;
    ck(cudaMalloc(&d, n * sizeof(float)), "cudaMalloc");
    ck(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    for (int s = 1; s <= steps; s++) {
        scale<<<blocks, threads>>>(d, n, 0.5f);
        poke<<<blocks, threads>>>(d, n, -1, -1, 0);
        if (s % 5 == 0) {
            ck(cudaMemcpy(h, d, 4096, cudaMemcpyDeviceToHost), "read-back");
            printf("step %d: x[7] = %.4f\n", s, h[7]);
        }
    }
    if (fail) poke<<<blocks, threads>>>(d, n, 3, 17, 1LL << 36);
    ck(cudaDeviceSynchronize(), "synchronize");
    ck(cudaMemcpy(h, d, 4096, cudaMemcpyDeviceToHost), "final read-back");
    printf("done: x[7] = %.4f\n", h[7]);
    return 0;
}
