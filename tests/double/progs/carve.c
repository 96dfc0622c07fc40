/* carve.c -- a caching allocator's habit: one cuMemAlloc carved into 8 "tensors" of 64 KiB
 * (T[k] = big + k * 64 KiB), each uploaded with its own H2D copy.  Then:
 *   add_one(T[0]), add_one(T[5])            -- other kernels on other tensors
 *   saxpy(2, x=T[2], y=T[6], 16384)         -- one kernel on two of the tensors
 *   saxpy(3, x=T[1], y=T[4], 32768)         -- reads and writes two tensors' worth each
 * and reads the whole allocation back.  Prints CARVE OK when every value is as computed. */
#include <string.h>
#include "common.h"

enum { NT = 8, TN = 16384, TB = TN * 4 };

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one, saxpy;
    CUdeviceptr big, t[NT];
    static float host[NT][TN], want[NT][TN], got[NT][TN];

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc(&big, (size_t)NT * TB));
    for (int k = 0; k < NT; k++) {
        t[k] = big + (CUdeviceptr)k * TB;
        for (int i = 0; i < TN; i++) host[k][i] = (float)(k * 1000 + i % 977);
        CK(cuMemcpyHtoD(t[k], host[k], TB));
    }
    memcpy(want, host, sizeof want);
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    int n = TN, n2 = 2 * TN;
    float a2 = 2.0f, a3 = 3.0f;
    void *p0[] = {&t[0], &n}, *p5[] = {&t[5], &n};
    LAUNCH(cuLaunchKernel(add_one, TN / 256, 1, 1, 256, 1, 1, 0, NULL, p0, NULL));
    LAUNCH(cuLaunchKernel(add_one, TN / 256, 1, 1, 256, 1, 1, 0, NULL, p5, NULL));
    for (int i = 0; i < TN; i++) want[0][i] += 1.0f, want[5][i] += 1.0f;
    void *s1[] = {&a2, &t[2], &t[6], &n};
    LAUNCH(cuLaunchKernel(saxpy, TN / 256, 1, 1, 256, 1, 1, 0, NULL, s1, NULL));
    for (int i = 0; i < TN; i++) want[6][i] = 2.0f * want[2][i] + want[6][i];
    void *s2[] = {&a3, &t[1], &t[4], &n2};
    LAUNCH(cuLaunchKernel(saxpy, 2 * TN / 256, 1, 1, 256, 1, 1, 0, NULL, s2, NULL));
    float *x = &want[1][0], *y = &want[4][0];
    for (int i = 0; i < 2 * TN; i++) y[i] = 3.0f * x[i] + y[i];
    CK(cuMemcpyDtoH(got, big, sizeof got));
    int ok = memcmp(got, want, sizeof got) == 0;
    CK(cuMemFree(big));
    CK(cuModuleUnload(mod));
    CK(cuDevicePrimaryCtxRelease(dev));
    printf("CARVE %s\n", ok ? "OK" : "BAD");
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
