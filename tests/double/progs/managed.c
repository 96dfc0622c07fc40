/* managed.c -- managed memory the host writes and reads in place, as nvcc programs that use
 * cudaMallocManaged do: no copy call carries the data either way. The host fills x, add_one(x)
 * runs twice, the context is synchronized and the host sums x; the host rewrites the first
 * half, add_one(x) runs once more, and after a synchronization the host sums x again; then x is
 * freed. Prints "SUMS s1 s2". */
#include <stdint.h>
#include "common.h"

enum { N = 1024 };

static double total(const float *x) {
    double s = 0;
    for (int i = 0; i < N; i++) s += x[i];
    return s;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one;
    CUdeviceptr m;
    int n = N;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuMemAllocManaged(&m, N * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *x = (float *)(uintptr_t)m;
    for (int i = 0; i < N; i++) x[i] = (float)(i % 10);
    void *args[] = {&m, &n};
    LAUNCH(cuLaunchKernel(add_one, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    LAUNCH(cuLaunchKernel(add_one, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    double s1 = total(x);
    for (int i = 0; i < N / 2; i++) x[i] = 100.0f;
    LAUNCH(cuLaunchKernel(add_one, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    double s2 = total(x);
    printf("SUMS %.0f %.0f\n", s1, s2);
    CK(cuMemFree(m));
    CK(cuCtxDestroy(ctx));
    return 0;
}
