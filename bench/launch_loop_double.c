/* Launch-bound loop on the test-double driver (no GPU): N launches of the double's add_one
 * kernel with n=0 (an empty kernel), through entry points taken from cuGetProcAddress_v2 the
 * way the CUDA runtime does.  Capture it and replay it to measure the replayer's CPU cost per
 * launch (bench/bench_replay_double.py).
 * Build: cc -O2 -I tests/double -o launch_loop_double bench/launch_loop_double.c -ldl
 * Usage: launch_loop_double [N=100000] [H2D_MB=0]   prints us_per_launch and LAUNCHES <n>
 * H2D_MB > 0 first copies that many MiB of random data to a device allocation (the double's
 * stand-in for bench/big_mem.cu: time to the first replayed kernel of a big snapshot). */
#define CUDA_DOUBLE_NO_API_MACROS
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "cuda_double.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "launch_loop_double: %s = %d\n", #x, (int)r_); return 1; } } while (0)

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    size_t h2d = (size_t)(argc > 2 ? atol(argv[2]) : 0) << 20;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "no cuGetProcAddress_v2\n"); return 1; }
    CUresult (*init)(unsigned), (*dget)(CUdevice *, int), (*ctxc)(CUcontext *, unsigned, CUdevice);
    CUresult (*alloc)(CUdeviceptr *, size_t), (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*load)(CUmodule *, const void *), (*getf)(CUfunction *, CUmodule, const char *), (*sync)(void);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUdriverProcAddressQueryResult st;
    gpa("cuInit", (void **)&init, 13000, 0, &st); gpa("cuDeviceGet", (void **)&dget, 13000, 0, &st);
    gpa("cuCtxCreate", (void **)&ctxc, 3020, 0, &st); gpa("cuCtxSynchronize", (void **)&sync, 2000, 0, &st);
    gpa("cuModuleLoadData", (void **)&load, 13000, 0, &st); gpa("cuModuleGetFunction", (void **)&getf, 13000, 0, &st);
    gpa("cuLaunchKernel", (void **)&launch, 13000, 0, &st);
    gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st); gpa("cuMemcpyHtoD", (void **)&htod, 3020, 0, &st);
    CUdevice dev; CUcontext ctx; CUmodule m; CUfunction f;
    CK(init(0)); CK(dget(&dev, 0)); CK(ctxc(&ctx, 0, dev));
    CK(load(&m, "CUDADOUBLE\nkernel add_one\n")); CK(getf(&f, m, "add_one"));
    CUdeviceptr p = 0; int zero = 0; void *args[] = {&p, &zero};
    if (h2d) {
        uint64_t *buf = malloc(h2d), x = 88172645463325252ull;
        if (!buf) return 1;
        for (size_t i = 0; i < h2d / 8; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; buf[i] = x; }
        CK(alloc(&p, h2d)); CK(htod(p, buf, h2d));
        free(buf);
    }
    double t0 = now();
    for (long i = 0; i < n; i++) CK(launch(f, 1, 1, 1, 1, 1, 1, 0, 0, args, NULL));
    CK(sync());
    double t1 = now();
    printf("us_per_launch %.4f\nLAUNCHES %ld\n", (t1 - t0) / (n ? n : 1), n);
    return 0;
}
