// diag_runtime_ctx.cu: is the context the CUDA runtime makes current its device's primary context?
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
int main() {
    cudaFree(0);
    CUcontext cur = 0, prim = 0; CUdevice dev = -1; unsigned flags = 0; int active = -1;
    cuCtxGetCurrent(&cur);
    CUresult r1 = cuCtxGetDevice_v2(&dev, cur);
    CUresult r2 = cuDevicePrimaryCtxGetState(dev, &flags, &active);
    CUresult r3 = cuDevicePrimaryCtxRetain(&prim, dev);
    printf("cur=%p dev=%d (r%d) active=%d flags=%u (r%d) primary=%p (r%d) same=%d\n", (void*)cur, dev, r1, active, flags, r2, (void*)prim, r3, cur == prim);
    unsigned long long id1 = 0, id2 = 0; cuCtxGetId(cur, &id1); cuCtxGetId(prim, &id2);
    printf("ids %llu %llu\n", id1, id2);
    return 0;
}
