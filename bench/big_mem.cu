// Device memory filled from the host, then kernels read it: the snapshot behind the "time to
// first replayed kernel" and big-snapshot benchmarks.
// Usage: big_mem [GIB=1] [BUFFERS=1] [LAUNCHES=1]. With no arguments: one 1 GiB buffer of
// random words, one launch. With more buffers, odd-numbered ones hold fp16-like values
// (zstd shrinks them) and the others random words (stored raw), so a snapshot of it needs
// both decompression and plain reads; `big_mem 6 54 99` makes 55 allocations (the
// buffers and the result) and 99 launches, a ~5.5 GiB snapshot.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
__global__ void checksum(const uint32_t *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += p[i];
    atomicAdd(out, s);
}
int main(int argc, char **argv) {
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    int nbuf = argc > 2 ? atoi(argv[2]) : 1, launches = argc > 3 ? atoi(argv[3]) : 1;
    if (nbuf < 1 || launches < 1 || gib <= 0) { fprintf(stderr, "usage: big_mem [GIB] [BUFFERS] [LAUNCHES]\n"); return 2; }
    size_t bytes = (size_t)(gib * (1ull << 30)) / nbuf / 4 * 4, n = bytes / 4;
    uint32_t *h = (uint32_t *)malloc(bytes);
    if (!h) { fprintf(stderr, "big_mem: no host memory\n"); return 1; }
    std::vector<uint32_t *> d(nbuf);
    unsigned long long *dout, out = 0;
    uint64_t x = 88172645463325252ull;
    for (int b = 0; b < nbuf; b++) {
        bool half = nbuf > 1 && (b & 1);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            h[i] = half ? (uint32_t)(0x3C003C00u + ((x & 0x1FF) | ((x >> 16) & 0x1FF) << 16)) : (uint32_t)x;
        }
        if (cudaMalloc(&d[b], bytes) != cudaSuccess) { fprintf(stderr, "big_mem: cudaMalloc failed\n"); return 1; }
        cudaMemcpy(d[b], h, bytes, cudaMemcpyHostToDevice);
    }
    cudaMalloc(&dout, 8); cudaMemset(dout, 0, 8);
    for (int k = 0; k < launches; k++) checksum<<<1024, 256>>>(d[k % nbuf], n, dout);
    cudaMemcpy(&out, dout, 8, cudaMemcpyDeviceToHost);
    printf("checksum %llu\nLAUNCHES %d\n", out, launches);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
