/* A framework-like call mix on the test-double driver (no GPU): per step a context set, two
 * launches, an event record and a stream wait on it, an async memset and an async D2D copy,
 * a stream query, and a D2H every 10 steps (about 14 calls a step: 10000 steps give 142k
 * records).  The snapshot behind bench/bench_format.py's records/s rows.
 * Build: cc -O2 -I tests/double -o records_double bench/records_double.c -ldl
 * Usage: records_double [STEPS=10000]   prints CALLS <n> */
#define CUDA_DOUBLE_NO_API_MACROS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_double.h"

#define CK(x) do { CUresult r_ = (x); calls++; if (r_) { fprintf(stderr, "records_double: %s = %d\n", #x, (int)r_); return 1; } } while (0)
#define GET(name, ptr, ver) gpa(name, (void **)&(ptr), ver, 0, &st)

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 10000, calls = 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "no cuGetProcAddress_v2\n"); return 1; }
    CUdriverProcAddressQueryResult st;
    CUresult (*init)(unsigned), (*dget)(CUdevice *, int), (*retain)(CUcontext *, CUdevice), (*setc)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t), (*load)(CUmodule *, const void *);
    CUresult (*getf)(CUfunction *, CUmodule, const char *), (*sync)(void);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*screate)(CUstream *, unsigned), (*ecreate)(CUevent *, unsigned), (*erec)(CUevent, CUstream);
    CUresult (*swait)(CUstream, CUevent, unsigned), (*memset8)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*d2d)(CUdeviceptr, CUdeviceptr, size_t, CUstream), (*d2h)(void *, CUdeviceptr, size_t);
    CUresult (*squery)(CUstream);
    GET("cuInit", init, 13000); GET("cuDeviceGet", dget, 13000); GET("cuDevicePrimaryCtxRetain", retain, 7000);
    GET("cuCtxSetCurrent", setc, 4000); GET("cuMemAlloc", alloc, 3020); GET("cuModuleLoadData", load, 13000);
    GET("cuModuleGetFunction", getf, 13000); GET("cuCtxSynchronize", sync, 2000); GET("cuLaunchKernel", launch, 13000);
    GET("cuStreamCreate", screate, 2000); GET("cuEventCreate", ecreate, 2000); GET("cuEventRecord", erec, 2000);
    GET("cuStreamWaitEvent", swait, 3020); GET("cuMemsetD8Async", memset8, 3020);
    GET("cuMemcpyDtoDAsync", d2d, 3020); GET("cuMemcpyDtoH", d2h, 3020); GET("cuStreamQuery", squery, 2000);
    CUdevice dev; CUcontext ctx; CUmodule m; CUfunction f, g; CUstream s1, s2; CUevent ev;
    CUdeviceptr a, b;
    CK(init(0)); CK(dget(&dev, 0)); CK(retain(&ctx, dev)); CK(setc(ctx));
    CK(load(&m, "CUDADOUBLE\nkernel add_one\nkernel saxpy\n")); CK(getf(&f, m, "add_one")); CK(getf(&g, m, "saxpy"));
    CK(screate(&s1, 1)); CK(screate(&s2, 1)); CK(ecreate(&ev, 2));
    CK(alloc(&a, 4096)); CK(alloc(&b, 4096));
    int n = 64; float two = 2.0f; float host[64];
    void *a1[] = {&a, &n}, *a2[] = {&two, &a, &b, &n};
    for (long i = 0; i < steps; i++) {
        CK(setc(ctx));
        CK(launch(f, 1, 1, 1, 64, 1, 1, 0, s1, a1, NULL));
        CK(launch(g, 1, 1, 1, 64, 1, 1, 0, s1, a2, NULL));
        CK(erec(ev, s1));
        CK(swait(s2, ev, 0));
        CK(memset8(b, 0, 256, s2));
        CK(d2d(a, b, 256, s2));
        CK(erec(ev, s2));
        CK(swait(s1, ev, 0));
        CK(launch(f, 1, 1, 1, 64, 1, 1, 0, s1, a1, NULL));
        CK(memset8(a + 1024, 1, 256, s1));
        CK(squery(s2));
        CK(erec(ev, s1));
        if (i % 10 == 9) CK(d2h(host, a, sizeof host));
        else CK(squery(s1));
    }
    CK(sync());
    printf("CALLS %ld\n", calls);
    return 0;
}
