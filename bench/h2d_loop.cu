// Host-to-device copy loop: ITERS copies of 256 MiB of random data from pinned memory.
// Mode "unique" (default): before each copy one word of every 4 MiB is changed, so no copy
// repeats an earlier one (worst case: nothing to dedup, nothing compresses). Mode "same":
// the same buffer every time (a loop re-uploading one tensor).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 8;
    int same = argc > 2 && argv[2][0] == 's';
    size_t bytes = 256ull << 20;
    uint32_t *h; void *d;
    cudaMallocHost((void **)&h, bytes); cudaMalloc(&d, bytes);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < bytes / 4; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; h[i] = (uint32_t)x; }
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; it++) {
        if (!same) for (size_t c = 0; c < bytes / 4; c += (4u << 20) / 4) h[c] = (uint32_t)(it + 1);
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    }
    cudaDeviceSynchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("H2D %d x 256 MiB in %.3f s = %.2f GB/s\n", iters, s, iters * (double)bytes / s / 1e9);
    return 0;
}
