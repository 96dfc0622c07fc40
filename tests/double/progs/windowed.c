/* windowed.c -- a training-loop shape for capture windows and the flight recorder:
 * `windowed STEPS [SLEEP_MS [ACTION AT]]`. Each step frees and allocates a scratch buffer,
 * creates and destroys a stream, uploads to the scratch buffer, launches add_one on a
 * long-lived buffer and incr on the scratch one, copies results back and folds them into a
 * checksum; prints "STEP i" after each step and "SUM s" / "LAUNCHES n" at the end. At step
 * AT, ACTION: fail (a launch with an illegal address: the double returns
 * CUDA_ERROR_ILLEGAL_ADDRESS), segv, abort, kill (SIGKILL itself), _exit (ends with status 0,
 * skipping exit handlers). A 9 MiB "weights" buffer
 * is uploaded once and read back every 10th step (state chunks that never change). BIG_MB
 * (5th argument) adds a buffer of that many MiB, one MiB of it rewritten each step. */
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 10, sleep_ms = argc > 2 ? atol(argv[2]) : 0;
    const char *action = argc > 3 ? argv[3] : "none";
    long at = argc > 4 ? atol(argv[4]) : -1;
    long big_mb = argc > 5 ? atol(argv[5]) : 0;
    enum { N = 1024 };
    static float h[N];
    static int hi[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one, incr;
    CUdeviceptr a, scratch = 0, wts;
    enum { W = 9 << 20 };
    static unsigned char hw[W];
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuModuleGetFunction(&incr, mod, "incr"));
    CK(cuMemAlloc(&a, sizeof h));
    for (int i = 0; i < N; i++) h[i] = (float)i;
    CK(cuMemcpyHtoD(a, h, sizeof h));
    CK(cuMemAlloc(&wts, W));
    for (int i = 0; i < W; i++) hw[i] = (unsigned char)(i * 7 + (i >> 20));
    CK(cuMemcpyHtoD(wts, hw, W));
    CUdeviceptr big = 0;
    if (big_mb > 0) {
        CK(cuMemAlloc(&big, (size_t)big_mb << 20));
        for (long m = 0; m < big_mb; m++) CK(cuMemsetD8(big + ((CUdeviceptr)m << 20), (unsigned char)(m * 13 + 1), 1 << 20));
    }
    double sum = 0;
    int n = N;
    for (long s = 0; s < steps; s++) {
        if (s == at) {
            if (!strcmp(action, "fail")) {
                CUdeviceptr bad = 0x10;
                void *bargs[] = {&bad, &n};
                CK(cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, NULL, bargs, NULL));
            } else if (!strcmp(action, "segv")) {
                raise(SIGSEGV);
            } else if (!strcmp(action, "abort")) {
                abort();
            } else if (!strcmp(action, "kill")) {
                raise(SIGKILL);
            } else if (!strcmp(action, "_exit")) {
                fflush(stdout);
                _exit(0);
            }
        }
        CUstream st;
        CK(cuStreamCreate(&st, 0));
        if (scratch) CK(cuMemFree(scratch));
        CK(cuMemAlloc(&scratch, sizeof hi));
        for (int i = 0; i < N; i++) hi[i] = (int)(s * 3 + i);
        CK(cuMemcpyHtoDAsync(scratch, hi, sizeof hi, st));
        void *aargs[] = {&a, &n};
        void *iargs[] = {&scratch, &n};
        LAUNCH(cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, st, aargs, NULL));
        LAUNCH(cuLaunchKernel(incr, 1, 1, 1, N, 1, 1, 0, st, iargs, NULL));
        CK(cuStreamSynchronize(st));
        CK(cuMemcpyDtoH(h, a, sizeof h));
        CK(cuMemcpyDtoH(hi, scratch, sizeof hi));
        for (int i = 0; i < N; i += 97) sum += h[i] + hi[i];
        if (s % 10 == 9) {
            CK(cuMemcpyDtoH(hw, wts, W));
            for (int i = 0; i < W; i += 4099) sum += hw[i];
            if (big) {                           /* the big buffer's last bytes, read back */
                unsigned char t[64];
                CK(cuMemcpyDtoH(t, big + ((CUdeviceptr)big_mb << 20) - sizeof t, sizeof t));
                for (int i = 0; i < 64; i++) sum += t[i];
            }
        }
        if (big) CK(cuMemsetD8(big + ((CUdeviceptr)(s % big_mb) << 20), (unsigned char)s, 1 << 20));
        CK(cuStreamDestroy(st));
        printf("STEP %ld\n", s);
        fflush(stdout);
        if (sleep_ms > 0) {
            struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    CK(cuMemFree(scratch));
    CK(cuMemFree(a));
    CK(cuMemFree(wts));
    if (big) {
        unsigned char tail[64];
        CK(cuMemcpyDtoH(tail, big + ((CUdeviceptr)big_mb << 20) - sizeof tail, sizeof tail));
        for (int i = 0; i < 64; i++) sum += tail[i];
        CK(cuMemFree(big));
    }
    printf("SUM %.1f\n", sum);
    printf("LAUNCHES %ld\n", g_launches);
    return 0;
}
