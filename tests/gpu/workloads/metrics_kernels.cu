// Two kernels with known characters, for `--profile metrics` against Nsight Compute:
// stream_triad (memory-bound: a[i] = b[i] + s * c[i] over 3 x 256 MiB) and fma_chain
// (compute-bound: 8 independent FP32 FMA chains per thread, no memory traffic but one store).
// Each runs 3 times; extern "C" keeps the names ncu and cudasnap print the same.
// Build: nvcc -O3 -arch=sm_90 -o metrics_kernels metrics_kernels.cu
#include <cstdio>
#include <cuda_runtime.h>

extern "C" __global__ void stream_triad(float *a, const float *b, const float *c, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = b[i] + s * c[i];
}

extern "C" __global__ void fma_chain(float *out, int iters) {
    float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    const float b = 0.999999f, c = 0.001f;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            x0 = fmaf(x0, b, c); x1 = fmaf(x1, b, c); x2 = fmaf(x2, b, c); x3 = fmaf(x3, b, c);
            x4 = fmaf(x4, b, c); x5 = fmaf(x5, b, c); x6 = fmaf(x6, b, c); x7 = fmaf(x7, b, c);
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    const size_t n = 64u << 20;                       // 64 Mi floats: 256 MiB per array
    float *a, *b, *c, *o;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int grid_fma = sms * 8, block = 256;
    CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&c, n * 4));
    CK(cudaMalloc(&o, (size_t)grid_fma * block * 4));
    CK(cudaMemset(a, 0, n * 4)); CK(cudaMemset(b, 0, n * 4)); CK(cudaMemset(c, 0, n * 4));
    for (int r = 0; r < 3; r++) {
        stream_triad<<<sms * 16, 512>>>(a, b, c, 2.0f, n);
        CK(cudaGetLastError());
        fma_chain<<<grid_fma, block>>>(o, 2048);
        CK(cudaGetLastError());
    }
    float h[4];
    CK(cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost));
    float t;
    CK(cudaMemcpy(&t, a + n - 1, 4, cudaMemcpyDeviceToHost));
    printf("fma_chain[0..3] %g %g %g %g triad[n-1] %g\n", h[0], h[1], h[2], h[3], t);
    return 0;
}
