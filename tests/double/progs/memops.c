/* memops.c -- stream memory operations on device memory: a 32-bit flag written by one stream
 * and waited for by another, then incremented by a kernel and read back; a 64-bit write and
 * read. Prints "FLAG f WIDE w". */
#include "common.h"

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction incr;
    CUstream a, b;
    CUdeviceptr flag, wide;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&incr, mod, "incr"));
    CK(cuStreamCreate(&a, 0));
    CK(cuStreamCreate(&b, 0));
    CK(cuMemAlloc(&flag, 4));
    CK(cuMemAlloc(&wide, 8));
    CK(cuStreamWriteValue32(a, flag, 41, 0));
    CK(cuStreamWaitValue32(b, flag, 41, CU_STREAM_WAIT_VALUE_EQ));
    int n = 1;
    void *args[] = {&flag, &n};
    LAUNCH(cuLaunchKernel(incr, 1, 1, 1, 1, 1, 1, 0, b, args, NULL));
    CK(cuStreamWriteValue64(a, wide, 0x123456789ull, 0));
    CK(cuStreamWaitValue64(b, wide, 0x100000000ull, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuCtxSynchronize());
    int f = 0;
    unsigned long long w = 0;
    CK(cuMemcpyDtoH(&f, flag, 4));
    CK(cuMemcpyDtoH(&w, wide, 8));
    printf("FLAG %d WIDE %llx\n", f, w);
    return 0;
}
