/* peer.c -- one process, two devices (CUDA_DOUBLE_DEVICES=2): device 1 enables peer access
 * to device 0, runs add_one over device 0's buffer, copies it to its own with cuMemcpyPeer;
 * device 0 copies the result back (cuMemcpyPeer) and reads it. Small allocations on both.
 * Prints PEER CHECKSUM; exit 3 with fewer than two devices. */
#include "common.h"

enum { N = 1024 };

int main(void) {
    int n = 0;
    CUdevice d0, d1;
    CUcontext c0, c1;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr a, s0, b, s1, c;
    static float in[N], out[N];
    CK(cuInit(0));
    CK(cuDeviceGetCount(&n));
    if (n < 2) { fprintf(stderr, "needs two devices\n"); return 3; }
    CK(cuDeviceGet(&d0, 0));
    CK(cuDeviceGet(&d1, 1));
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuDevicePrimaryCtxRetain(&c1, d1));
    CK(cuCtxSetCurrent(c0));
    for (int i = 0; i < N; i++) in[i] = (float)(3 * i);
    CK(cuMemAlloc(&a, sizeof in));
    CK(cuMemAlloc(&s0, 256));
    CK(cuMemcpyHtoD(a, in, sizeof in));
    CK(cuMemsetD8(s0, 1, 256));
    CK(cuCtxSetCurrent(c1));
    int can = 0;
    CK(cuDeviceCanAccessPeer(&can, d1, d0));
    CK(cuCtxEnablePeerAccess(c0, 0));
    CK(cuMemAlloc(&b, sizeof in));
    CK(cuMemAlloc(&s1, 256));
    CK(cuMemsetD8(s1, 2, 256));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int cnt = N;
    void *args[] = {&a, &cnt};                 /* device 1's kernel over device 0's memory */
    LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
    CK(cuMemcpyPeer(b, c1, a, c0, sizeof in));
    CK(cuCtxSetCurrent(c0));
    CK(cuMemAlloc(&c, sizeof in));
    CK(cuMemcpyPeer(c, c0, b, c1, sizeof in));
    CK(cuMemcpyDtoH(out, c, sizeof out));
    double s = 0;
    for (int i = 0; i < N; i++) s += out[i];
    printf("PEER CHECKSUM %.1f (can access %d)\n", s, can);
    return 0;
}
