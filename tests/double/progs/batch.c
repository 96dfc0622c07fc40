/* batch.c -- copies issued as batches (cuMemcpyBatchAsync, CUDA 12.8+): three host chunks to
 * device memory, those chunks device to device in reverse order, add_one over the result, and
 * the result back to three host buffers in one more batch. Prints "BATCH sum". */
#include <stdint.h>
#include <string.h>
#include "common.h"

enum { N = 256, K = 3 };

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one;
    CUdeviceptr d, e;
    CUstream s;
    static float src[K][N], back[K][N];
    int n = K * N;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuMemAlloc(&d, sizeof src));
    CK(cuMemAlloc(&e, sizeof src));
    CK(cuStreamCreate(&s, 0));
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) src[k][i] = (float)(k * 10 + i % 7);
    CUdeviceptr dsts[K], srcs[K];
    size_t sizes[K], idx = 0;
    CUmemcpyAttributes at;
    memset(&at, 0, sizeof at);
    for (int k = 0; k < K; k++) { dsts[k] = d + k * N * 4; srcs[k] = (CUdeviceptr)(uintptr_t)src[k]; sizes[k] = N * 4; }
    CK(cuMemcpyBatchAsync(dsts, srcs, sizes, K, &at, &idx, 1, s));
    for (int k = 0; k < K; k++) { dsts[k] = e + (K - 1 - k) * N * 4; srcs[k] = d + k * N * 4; }
    CK(cuMemcpyBatchAsync(dsts, srcs, sizes, K, &at, &idx, 1, s));
    void *args[] = {&e, &n};
    LAUNCH(cuLaunchKernel(add_one, 3, 1, 1, 256, 1, 1, 0, s, args, NULL));
    for (int k = 0; k < K; k++) { dsts[k] = (CUdeviceptr)(uintptr_t)back[k]; srcs[k] = e + k * N * 4; }
    CK(cuMemcpyBatchAsync(dsts, srcs, sizes, K, &at, &idx, 1, s));
    CK(cuStreamSynchronize(s));
    double t = 0;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) t += back[k][i] * (k + 1);
    printf("BATCH %.0f\n", t);
    return 0;
}
