// Stream memory operations on device memory: stream a writes a flag, stream b waits for it
// before a kernel increments it; a 64-bit write and a GEQ wait. Prints "FLAG f WIDE w".
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void incr(int *p) { *p += 1; }

#define CK(x) do { CUresult r_ = (x); if (r_) { std::printf("error %d at %s\n", (int)r_, #x); return 1; } } while (0)

int main() {
    cudaStream_t a, b;
    int *flag;
    unsigned long long *wide;
    cudaStreamCreate(&a);
    cudaStreamCreate(&b);
    cudaMalloc(&flag, sizeof *flag);
    cudaMalloc(&wide, sizeof *wide);
    CK(cuStreamWriteValue32((CUstream)a, (CUdeviceptr)flag, 41, 0));
    CK(cuStreamWaitValue32((CUstream)b, (CUdeviceptr)flag, 41, CU_STREAM_WAIT_VALUE_EQ));
    incr<<<1, 1, 0, b>>>(flag);
    CK(cuStreamWriteValue64((CUstream)a, (CUdeviceptr)wide, 0x123456789ull, 0));
    CK(cuStreamWaitValue64((CUstream)b, (CUdeviceptr)wide, 0x100000000ull, CU_STREAM_WAIT_VALUE_GEQ));
    cudaDeviceSynchronize();
    int f = 0;
    unsigned long long w = 0;
    cudaMemcpy(&f, flag, sizeof f, cudaMemcpyDeviceToHost);
    cudaMemcpy(&w, wide, sizeof w, cudaMemcpyDeviceToHost);
    std::printf("FLAG %d WIDE %llx\n", f, w);
    return f == 42 && w == 0x123456789ull ? 0 : 3;
}
