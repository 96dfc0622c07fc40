/* direct.c -- linked with -lcuda against the test double: init, context, alloc, copy,
 * module load, add_one launched N times (argv[1], default 10), copy back, checksum. */
#include "common.h"

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    enum { N = 1024 };
    static float h[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    char name[64];

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&d, N * sizeof(float)));
    for (int i = 0; i < N; i++) h[i] = (float)i;
    CK(cuMemcpyHtoD(d, h, sizeof h));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    for (int i = 0; i < iters; i++) LAUNCH(cuLaunchKernel(f, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(h, d, sizeof h));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += h[i];
    CK(cuMemFree(d));
    CK(cuModuleUnload(mod));
    CK(cuCtxDestroy(ctx));
    printf("DEVICE %s\n", name);
    printf("CHECKSUM %.1f\n", sum);
    printf("LAUNCHES %ld\n", g_launches);
    return 0;
}
