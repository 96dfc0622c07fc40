// 1 GiB of device memory filled from the host, then one kernel reads it: the snapshot
// behind the "time to first replayed kernel" benchmark.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
__global__ void checksum(const uint32_t *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += p[i];
    atomicAdd(out, s);
}
int main() {
    size_t bytes = 1ull << 30, n = bytes / 4;
    uint32_t *h = (uint32_t *)malloc(bytes);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; h[i] = (uint32_t)x; }
    uint32_t *d; unsigned long long *dout, out = 0;
    cudaMalloc(&d, bytes); cudaMalloc(&dout, 8); cudaMemset(dout, 0, 8);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    checksum<<<1024, 256>>>(d, n, dout);
    cudaMemcpy(&out, dout, 8, cudaMemcpyDeviceToHost);
    printf("checksum %llu\nLAUNCHES 1\n", out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
