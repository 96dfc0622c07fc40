// A kernel whose occupancy its launch size limits: chase_smem holds 48,000 bytes of static
// shared memory per block, so an SM takes 4 blocks; at 128 threads per block that is 16 warps
// (25% on sm_90). Each thread follows a chain of dependent loads (latency-bound: more warps
// hide more of it) and makes no assumption about its block size, so 512-thread blocks (64
// warps, 100%) compute the same results. Launched 3 times over 4 Mi elements, one per thread.
// Build: nvcc -O3 -arch=sm_90 -o advise_occupancy advise_occupancy.cu
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

extern "C" __global__ void chase_smem(const unsigned *next, unsigned *out, unsigned n, int steps) {
    __shared__ unsigned scratch[12000];
    volatile unsigned *s = scratch;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned j = i;
        for (int k = 0; k < steps; k++) j = next[j];
        s[threadIdx.x] = j;                       // the block's shared memory is really used
        out[i] = s[threadIdx.x] + 1u;
    }
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

int main() {
    const unsigned n = 1u << 22;
    std::vector<unsigned> h(n);
    for (unsigned i = 0; i < n; i++) h[i] = (unsigned)((i * 2654435761ull + 12345u) % n);
    unsigned *next, *out;
    CK(cudaMalloc(&next, n * 4ull)); CK(cudaMalloc(&out, n * 4ull));
    CK(cudaMemcpy(next, h.data(), n * 4ull, cudaMemcpyHostToDevice));
    for (int r = 0; r < 3; r++) {
        chase_smem<<<n / 128, 128>>>(next, out, n, 16);
        CK(cudaGetLastError());
    }
    CK(cudaMemcpy(h.data(), out, n * 4ull, cudaMemcpyDeviceToHost));
    unsigned long long sum = 0;
    for (unsigned i = 0; i < n; i++) sum += h[i];
    printf("chase_smem checksum %llu\n", sum);
    return 0;
}
