/* killme.c -- does some work, prints "READY <calls>" (driver calls made so far) and
 * flushes, then launches forever; with argv[1] = M > 0 it raise(SIGKILL)s itself
 * after M more launches; with M = -1 it launches the double's `spin` kernel for a minute
 * (the launch runs it synchronously: the program can be killed inside cuLaunchKernel).
 * Used to test a SIGKILL mid-run. */
#include <signal.h>
#include "common.h"

int main(int argc, char **argv) {
    long m = argc > 1 ? atol(argv[1]) : 0;
    enum { N = 256 };
    float h[N] = {0};
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemcpyHtoD(d, h, sizeof h));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    for (int i = 0; i < 5; i++) LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    printf("READY %ld\n", g_calls);
    printf("LAUNCHES %ld\n", g_launches);
    fflush(stdout);
    if (m < 0) {
        CUfunction spin;
        CK(cuModuleGetFunction(&spin, mod, "spin"));
        int ms = 60000;
        void *sargs[] = {&ms};
        printf("SPIN\n");
        fflush(stdout);
        LAUNCH(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, sargs, NULL));
        return 3;
    }
    for (long i = 0;; i++) {
        if (m > 0 && i == m) raise(SIGKILL);
        LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
        if (i % 64 == 63) CK(cuCtxSynchronize());
    }
}
