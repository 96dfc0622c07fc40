// nvcc program (static cudart) that stores device pointers in device memory: a table of
// pointers to buffers of many sizes, read through by a kernel. Prints results and a
// launch counter of its own.
#include <cstdio>
#include <cstdint>
#include <vector>

__global__ void fill(float *p, int n, float v) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v + i; }
__global__ void gather(float *const *table, const int *sizes, int nt, float *out) {
    int t = blockIdx.x; if (t >= nt) return;
    float s = 0; for (int i = threadIdx.x; i < sizes[t]; i += blockDim.x) s += table[t][i];
    atomicAdd(&out[t], s);   // float atomics: order may vary, sums here are exact integers
}

int main() {
    int launches = 0;
    const int nt = 12;
    std::vector<float *> bufs(nt); std::vector<int> sizes(nt);
    for (int t = 0; t < nt; t++) {
        sizes[t] = 16 << t;                          // 64 B .. 128 KiB of floats
        cudaMalloc(&bufs[t], sizes[t] * sizeof(float));
        fill<<<(sizes[t] + 255) / 256, 256>>>(bufs[t], sizes[t], (float)t); launches++;
    }
    float **dtable; int *dsizes; float *dout;
    cudaMalloc(&dtable, nt * sizeof(float *)); cudaMalloc(&dsizes, nt * sizeof(int)); cudaMalloc(&dout, nt * sizeof(float));
    cudaMemcpy(dtable, bufs.data(), nt * sizeof(float *), cudaMemcpyHostToDevice);
    cudaMemcpy(dsizes, sizes.data(), nt * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemset(dout, 0, nt * sizeof(float));
    gather<<<nt, 128>>>(dtable, dsizes, nt, dout); launches++;
    float out[nt]; cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    cudaError_t e = cudaDeviceSynchronize();
    for (int t = 0; t < nt; t++) printf("table[%d] size %d sum %.1f\n", t, sizes[t], out[t]);
    printf("LAUNCHES %d\n", launches);
    return e == cudaSuccess ? 0 : 1;
}
