/* tagged.c -- a kernel that reads through a pointer its parameters encode (tagged_read): the
 * source buffer is reachable neither from the parameters nor by pointer scanning, so only an
 * extract of every live allocation (--memory all) reproduces the result. */
#include "common.h"

#define TAG_KEY 0x5a5a000000000000ULL

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr src, out;
    unsigned long long vals[16], got[16];
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc(&src, sizeof vals));
    CK(cuMemAlloc(&out, sizeof got));
    for (int i = 0; i < 16; i++) vals[i] = 1000u + (unsigned)i * 3u;
    CK(cuMemcpyHtoD(src, vals, sizeof vals));
    CK(cuMemsetD8(out, 0, sizeof got));
    CK(cuModuleLoadData(&mod, "CUDADOUBLE\nkernel tagged_read\n"));
    CK(cuModuleGetFunction(&f, mod, "tagged_read"));
    unsigned long long tagged = (unsigned long long)src ^ TAG_KEY;
    int n = 16;
    void *args[] = {&tagged, &out, &n};
    LAUNCH(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CK(cuMemcpyDtoH(got, out, sizeof got));
    printf("tagged_read: %llu %llu\n", got[0], got[15]);
    return 0;
}
