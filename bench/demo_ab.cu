// A small CUDA runtime program for the compare / --replace / bisect demonstration
// (bench/demo_bisect_gpu.sh): three kernels with C names, each launched a few times,
// results copied back so replay verifies them byte for byte.
//
// Every result is exact whatever the build (-O3, -G, -Xptxas -O0): compute_k mixes integer
// bits, scale_k is one float multiply, reduce_k adds in a fixed order; so a rebuilt kernel
// swapped in with `cudasnap replay --replace` reproduces the recorded results and only its
// timing changes. Built with -DWIDE_N, compute_k takes a 64-bit n: another parameter layout,
// which --replace refuses.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#ifdef WIDE_N
typedef long long n_t;
#else
typedef int n_t;
#endif

extern "C" __global__ void compute_k(const unsigned *x, unsigned *y, n_t n, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned v = x[i];
    for (int k = 0; k < iters; k++) {
        v ^= v << 13;
        v ^= v >> 17;
        v ^= v << 5;
        v *= 0x9E3779B1u;
    }
    y[i] = v;
}

extern "C" __global__ void scale_k(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a;
}

extern "C" __global__ void reduce_k(const float *x, float *partial, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] = s[threadIdx.x] + s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
#ifndef WIDE_N
    int n = argc > 1 ? atoi(argv[1]) : 1 << 24;
    int iters = argc > 2 ? atoi(argv[2]) : 128;
    int reps = argc > 3 ? atoi(argv[3]) : 4;
    const int B = 256, G = (n + B - 1) / B;
    std::vector<unsigned> hx(n);
    std::vector<float> hf(n);
    for (int i = 0; i < n; i++) { hx[i] = 2654435761u * (unsigned)i + 12345u; hf[i] = (float)(i % 1000) * 0.001f; }
    unsigned *dx, *dy;
    float *df, *dp;
    CK(cudaMalloc(&dx, n * sizeof(unsigned)));
    CK(cudaMalloc(&dy, n * sizeof(unsigned)));
    CK(cudaMalloc(&df, n * sizeof(float)));
    CK(cudaMalloc(&dp, G * sizeof(float)));
    CK(cudaMemcpy(dx, hx.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(df, hf.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    for (int r = 0; r < reps; r++) {
        compute_k<<<G, B>>>(dx, dy, n, iters);
        scale_k<<<G, B>>>(df, 1.0009765625f, n);
        reduce_k<<<G, B>>>(df, dp, n);
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<unsigned> oy(n);
    std::vector<float> op(G);
    CK(cudaMemcpy(oy.data(), dy, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(op.data(), dp, G * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < G; i++) sum += op[i];
    printf("compute_k y[1]=%u y[n-1]=%u  reduce sum=%.3f  (%d launches)\n", oy[1], oy[n - 1], sum, 3 * reps);
    cudaFree(dx); cudaFree(dy); cudaFree(df); cudaFree(dp);
#endif
    return 0;
}
