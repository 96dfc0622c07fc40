// nvcc program for simulator replay: a block reduction in shared memory with barriers, block
// partials combined with integer atomics (order-independent, so results are exact).
#include <cstdio>
#include <vector>

__global__ void block_sum(const int *in, int n, unsigned long long *total, int *partials) {
    __shared__ int s[256];
    int i = blockIdx.x * blockDim.x * 2 + threadIdx.x;
    int v = 0;
    if (i < n) v += in[i];
    if (i + blockDim.x < n) v += in[i + blockDim.x];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) { partials[blockIdx.x] = s[0]; atomicAdd(total, (unsigned long long)s[0]); }
}

__global__ void histogram(const int *in, int n, unsigned *bins) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&bins[in[i] & 63], 1u);
}

int main() {
    const int n = 1 << 17, threads = 256, blocks = (n + threads * 2 - 1) / (threads * 2);
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (i * 2654435761u) >> 24;
    int *in, *partials; unsigned long long *total; unsigned *bins;
    cudaMalloc(&in, n * sizeof(int)); cudaMalloc(&partials, blocks * sizeof(int));
    cudaMalloc(&total, sizeof *total); cudaMalloc(&bins, 64 * sizeof(unsigned));
    cudaMemcpy(in, h.data(), n * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemset(total, 0, sizeof *total); cudaMemset(bins, 0, 64 * sizeof(unsigned));
    block_sum<<<blocks, threads>>>(in, n, total, partials);
    histogram<<<64, 256>>>(in, n, bins);
    unsigned long long t; unsigned hb[64];
    cudaMemcpy(&t, total, sizeof t, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, bins, sizeof hb, cudaMemcpyDeviceToHost);
    printf("reduce total %llu bin0 %u\nLAUNCHES 2\n", t, hb[0]);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
