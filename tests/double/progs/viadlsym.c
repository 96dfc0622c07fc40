/* viadlsym.c -- dlopen("libcuda.so.1") and dlsym every entry point by its ABI name;
 * same work as direct.c (argv[1] = iterations, default 10). */
#include <dlfcn.h>
#include "common.h"

#define LOAD(name)                                                          \
    __typeof__(&name) p_##name = (__typeof__(&name))dlsym(h, #name);        \
    if (!p_##name) { fprintf(stderr, "dlsym %s failed\n", #name); return 1; }

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    LOAD(cuInit) LOAD(cuDeviceGet) LOAD(cuDevicePrimaryCtxRetain) LOAD(cuDevicePrimaryCtxRelease_v2)
    LOAD(cuCtxSetCurrent) LOAD(cuMemAlloc_v2) LOAD(cuMemFree_v2) LOAD(cuMemcpyHtoD_v2) LOAD(cuMemcpyDtoH_v2)
    LOAD(cuModuleLoadData) LOAD(cuModuleGetFunction) LOAD(cuModuleUnload) LOAD(cuLaunchKernel)
    LOAD(cuCtxSynchronize) LOAD(cuMemsetD32_v2)

    enum { N = 1024 };
    static float hbuf[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    CK(p_cuInit(0));
    CK(p_cuDeviceGet(&dev, 0));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(p_cuCtxSetCurrent(ctx));
    CK(p_cuMemAlloc_v2(&d, N * sizeof(float)));
    CK(p_cuMemsetD32_v2(d, 0, N));
    for (int i = 0; i < N; i++) hbuf[i] = (float)i;
    CK(p_cuMemcpyHtoD_v2(d, hbuf, sizeof hbuf));
    CK(p_cuModuleLoadData(&mod, MODULE_TEXT));
    CK(p_cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    for (int i = 0; i < iters; i++) LAUNCH(p_cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(p_cuCtxSynchronize());
    CK(p_cuMemcpyDtoH_v2(hbuf, d, sizeof hbuf));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += hbuf[i];
    CK(p_cuMemFree_v2(d));
    CK(p_cuModuleUnload(mod));
    CK(p_cuDevicePrimaryCtxRelease_v2(dev));
    printf("CHECKSUM %.1f\n", sum);
    printf("LAUNCHES %ld\n", g_launches);
    return 0;
}
