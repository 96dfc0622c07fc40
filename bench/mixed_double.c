/* Framework-like call mix on the test-double driver (no GPU): per step cuCtxSetCurrent, two
 * launches, cuEventRecord + cuStreamWaitEvent, cuMemsetD32Async, cuMemcpyDtoDAsync, and a
 * cuMemcpyDtoH every 10 steps (what a training loop's host side looks like to the driver),
 * through entry points taken from cuGetProcAddress_v2 the way the CUDA runtime does.
 * Capture and replay it to measure the replayer's CPU cost per call
 * (bench/bench_replay_double.py).
 * Build: cc -O2 -I tests/double -o mixed_double bench/mixed_double.c -ldl
 * Usage: mixed_double [STEPS=20000]   prints us_per_call and CALLS <n> (calls in the loop) */
#define CUDA_DOUBLE_NO_API_MACROS
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "cuda_double.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "mixed_double: %s = %d\n", #x, (int)r_); return 1; } } while (0)
#define GPA(name, var, ver) do { CUdriverProcAddressQueryResult st_; \
    if (gpa(name, (void **)&var, ver, 0, &st_) || !var) { fprintf(stderr, "no %s\n", name); return 1; } } while (0)

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 20000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "no cuGetProcAddress_v2\n"); return 1; }
    CUresult (*init)(unsigned), (*dget)(CUdevice *, int), (*ctxc)(CUcontext *, unsigned, CUdevice), (*setc)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t), (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*load)(CUmodule *, const void *), (*getf)(CUfunction *, CUmodule, const char *), (*sync)(void);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*screate)(CUstream *, unsigned), (*ecreate)(CUevent *, unsigned), (*erec)(CUevent, CUstream);
    CUresult (*swait)(CUstream, CUevent, unsigned), (*mset)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    GPA("cuInit", init, 2000); GPA("cuDeviceGet", dget, 2000); GPA("cuCtxCreate", ctxc, 3020);
    GPA("cuCtxSetCurrent", setc, 4000); GPA("cuCtxSynchronize", sync, 2000);
    GPA("cuModuleLoadData", load, 2000); GPA("cuModuleGetFunction", getf, 2000);
    GPA("cuLaunchKernel", launch, 4000); GPA("cuMemAlloc", alloc, 3020); GPA("cuMemcpyDtoH", dtoh, 3020);
    GPA("cuStreamCreate", screate, 2000); GPA("cuEventCreate", ecreate, 2000); GPA("cuEventRecord", erec, 2000);
    GPA("cuStreamWaitEvent", swait, 3020); GPA("cuMemsetD32Async", mset, 3020); GPA("cuMemcpyDtoDAsync", dtod, 3020);
    CUdevice dev; CUcontext ctx; CUmodule m; CUfunction f_add, f_incr; CUstream s1, s2; CUevent ev;
    CK(init(0)); CK(dget(&dev, 0)); CK(ctxc(&ctx, 0, dev));
    CK(load(&m, "CUDADOUBLE\nkernel add_one\nkernel incr\n"));
    CK(getf(&f_add, m, "add_one")); CK(getf(&f_incr, m, "incr"));
    CK(screate(&s1, 0)); CK(screate(&s2, 0)); CK(ecreate(&ev, 0));
    enum { N = 16 };
    CUdeviceptr a, b, c;
    CK(alloc(&a, N * 4)); CK(alloc(&b, N * 4)); CK(alloc(&c, N * 4));
    int n = N; void *args_a[] = {&a, &n}, *args_b[] = {&b, &n};
    unsigned host[N];
    long calls = 0;
    double t0 = now();
    for (long i = 0; i < steps; i++) {
        CK(setc(ctx));
        CK(launch(f_add, 1, 1, 1, N, 1, 1, 0, s1, args_a, NULL));
        CK(launch(f_incr, 1, 1, 1, N, 1, 1, 0, s1, args_b, NULL));
        CK(erec(ev, s1));
        CK(swait(s2, ev, 0));
        CK(mset(c, (unsigned)i, N, s2));
        CK(dtod(c, a, N * 4, s2));
        calls += 7;
        if (i % 10 == 9) { CK(dtoh(host, c, N * 4)); calls++; }
    }
    CK(sync());
    double t1 = now();
    printf("us_per_call %.4f\nCALLS %ld\nlast %u\n", (t1 - t0) / (calls ? calls : 1), calls, host[0]);
    return 0;
}
