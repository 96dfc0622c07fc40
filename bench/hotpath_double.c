/* CPU cost of interception, measured on the test-double driver (no GPU needed):
 * N calls of cuCtxGetCurrent and N launches of a no-op kernel, ns per call.
 * Build: gcc -O2 -I tests/double -o hotpath bench/hotpath_double.c -ldl
 * Run natively and under `cudasnap capture`; bench/bench_hotpath.py does both. */
#define CUDA_DOUBLE_NO_API_MACROS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cuda_double.h"

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = dlsym(h, "cuGetProcAddress_v2");
    CUresult (*init)(unsigned), (*dget)(CUdevice *, int), (*ctxc)(CUcontext *, unsigned, CUdevice);
    CUresult (*cur)(CUcontext *), (*load)(CUmodule *, const void *), (*getf)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUdriverProcAddressQueryResult st;
    gpa("cuInit", (void **)&init, 13000, 0, &st); gpa("cuDeviceGet", (void **)&dget, 13000, 0, &st);
    gpa("cuCtxCreate", (void **)&ctxc, 3020, 0, &st); gpa("cuCtxGetCurrent", (void **)&cur, 13000, 0, &st);
    gpa("cuModuleLoadData", (void **)&load, 13000, 0, &st); gpa("cuModuleGetFunction", (void **)&getf, 13000, 0, &st);
    gpa("cuLaunchKernel", (void **)&launch, 13000, 0, &st);
    CUdevice dev; CUcontext ctx; CUmodule m; CUfunction f;
    init(0); dget(&dev, 0); ctxc(&ctx, 0, dev);
    load(&m, "CUDADOUBLE\nkernel add_one\n"); getf(&f, m, "add_one");
    CUdeviceptr p = 0; int zero = 0; void *args[] = {&p, &zero};
    for (int pass = 0; pass < 2; pass++) {   /* pass 0 warms caches and ring pages */
        double t0 = now();
        for (long i = 0; i < n; i++) cur(&ctx);
        double t1 = now();
        for (long i = 0; i < n; i++) launch(f, 1, 1, 1, 1, 1, 1, 0, 0, args, NULL);
        double t2 = now();
        if (pass) printf("cuCtxGetCurrent_ns %.1f\ncuLaunchKernel_ns %.1f\n", (t1 - t0) / n, (t2 - t1) / n);
    }
    printf("LAUNCHES %ld\n", 2 * n);
    return 0;
}
