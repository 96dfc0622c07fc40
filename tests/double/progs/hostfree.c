/* hostfree.c -- a kernel reads mapped pinned host memory through its device pointer, the host
 * memory is freed, and a later kernel runs on device memory: graph mode, which runs both
 * launches again after the replay passed the free, must keep the host memory until it is done.
 * Prints "HOSTFREE sum". */
#include "common.h"

enum { N = 1024 };

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one;
    CUdeviceptr d, dh;
    float *h, out[N];
    int n = N;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuMemAlloc(&d, N * sizeof(float)));
    CK(cuMemHostAlloc((void **)&h, N * sizeof(float), CU_MEMHOSTALLOC_DEVICEMAP));
    for (int i = 0; i < N; i++) h[i] = 1.0f;
    CK(cuMemHostGetDevicePointer(&dh, h, 0));
    void *ah[] = {&dh, &n};
    LAUNCH(cuLaunchKernel(add_one, 4, 1, 1, 256, 1, 1, 0, NULL, ah, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyHtoD(d, h, N * sizeof(float)));
    CK(cuMemFreeHost(h));
    void *ad[] = {&d, &n};
    LAUNCH(cuLaunchKernel(add_one, 4, 1, 1, 256, 1, 1, 0, NULL, ad, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(out, d, sizeof out));
    double s = 0;
    for (int i = 0; i < N; i++) s += out[i];
    printf("HOSTFREE %.0f\n", s);
    CK(cuMemFree(d));
    return 0;
}
