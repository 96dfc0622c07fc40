/* unified.c -- copies through unified addressing (cuMemcpy, cuMemcpyAsync) whose host end is
 * pageable memory or a pinned host allocation, as CUDA libraries issue them
 * (cudaMemcpyDefault): the host bytes must be captured for replay to restore and verify them.
 * Also asks a small allocation's range, which must not change under capture's placement. */
#include <string.h>
#include "common.h"

int main(void) {
    enum { N = 1024 };
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one;
    CUstream s;
    CUdeviceptr d;
    float *pinned, pageable[N], back[N];
    int n = N;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuStreamCreate(&s, 0));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuMemAlloc(&d, sizeof pageable));
    CK(cuMemAllocHost((void **)&pinned, sizeof pageable));
    for (int i = 0; i < N; i++) pageable[i] = (float)(i % 97);
    CK(cuMemcpy(d, (CUdeviceptr)pageable, sizeof pageable));          /* pageable -> device */
    void *args[] = {&d, &n};
    LAUNCH(cuLaunchKernel(add_one, N / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CK(cuMemcpyAsync((CUdeviceptr)back, d, sizeof back, s));         /* device -> pageable */
    CK(cuStreamSynchronize(s));
    for (int i = 0; i < N; i++) pinned[i] = back[i] * 2.0f;
    CK(cuMemcpyAsync(d, (CUdeviceptr)pinned, sizeof back, s));        /* pinned -> device */
    LAUNCH(cuLaunchKernel(add_one, N / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CK(cuMemcpy((CUdeviceptr)pinned, d, sizeof back));                /* device -> pinned */
    /* a small allocation's range is its own, whoever placed it */
    CUdeviceptr small;
    CUdeviceptr start = 0;
    size_t size = 0;
    CK(cuMemAlloc(&small, 1000));
    CK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, small + 10));
    CK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, small + 10));
    printf("RANGE own %d size %zu\n", start == small, size);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += pinned[i];
    printf("SUM %.1f\nLAUNCHES %ld\n", sum, g_launches);
    return 0;
}
