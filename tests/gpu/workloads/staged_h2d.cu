// Big host-to-device copies for replay's staging path (replay/staging.py): NBUF buffers of
// 40 MiB (+12 bytes, so the last chunk is partial), even ones uploaded with cudaMemcpy, odd
// ones with cudaMemcpyAsync on a stream the program made, half of them compressible; a kernel
// adds 1 to every word, and every buffer comes back whole, so replay verifies each byte.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#define NBUF 6
__global__ void inc(uint32_t *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1;
}
int main() {
    size_t bytes = (40u << 20) + 12, n = bytes / 4;
    uint32_t *h = (uint32_t *)malloc(bytes), *back = (uint32_t *)malloc(bytes);
    uint32_t *d[NBUF];
    cudaStream_t s;
    cudaStreamCreate(&s);
    uint64_t x = 88172645463325252ull;
    long bad = 0;
    for (int b = 0; b < NBUF; b++) {
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            h[i] = (b / 2) % 2 ? (uint32_t)(0x3C003C00u + (x & 0x1FF)) : (uint32_t)x;
        }
        cudaMalloc(&d[b], bytes);
        if (b % 2 == 0) {
            cudaMemcpy(d[b], h, bytes, cudaMemcpyHostToDevice);
            inc<<<256, 256>>>(d[b], n);
        } else {
            cudaMemcpyAsync(d[b], h, bytes, cudaMemcpyHostToDevice, s);
            inc<<<256, 256, 0, s>>>(d[b], n);
            cudaStreamSynchronize(s);      // h is refilled next
        }
        cudaMemcpy(back, d[b], bytes, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < n; i++) bad += back[i] != h[i] + 1;
    }
    printf("mismatches %ld\nLAUNCHES %d\n", bad, NBUF);
    return bad == 0 && cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
