/* viaproc.c -- like the CUDA runtime: dlopen libcuda.so.1, dlsym("cuGetProcAddress_v2"),
 * then obtain every entry point through it by base name and CUDA version; some with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, and one through the old
 * cuGetProcAddress signature.  argv[1] = iterations (default 10). */
#define CUDA_DOUBLE_NO_API_MACROS /* raw ABI names: cuGetProcAddress is the old 4-argument one */
#include <dlfcn.h>
#include <string.h>
#include "common.h"

static __typeof__(&cuGetProcAddress_v2) gpa;

#define GET(var, sym, ver, flags)                                                        \
    do {                                                                                 \
        CUdriverProcAddressQueryResult st_;                                              \
        CK(gpa(sym, (void **)&var, ver, flags, &st_));                                   \
        if (st_ != CU_GET_PROC_ADDRESS_SUCCESS || !var) {                                \
            fprintf(stderr, "cuGetProcAddress(%s) status %d\n", sym, (int)st_);          \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    gpa = (__typeof__(gpa))dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { fprintf(stderr, "no cuGetProcAddress_v2\n"); return 1; }

    __typeof__(&cuInit) p_init;
    __typeof__(&cuDriverGetVersion) p_ver;
    __typeof__(&cuDeviceGet) p_devget;
    __typeof__(&cuCtxCreate_v4) p_ctxcreate;
    __typeof__(&cuCtxDestroy_v2) p_ctxdestroy;
    __typeof__(&cuMemAlloc_v2) p_alloc;
    __typeof__(&cuMemFree_v2) p_free;
    __typeof__(&cuMemcpyHtoD_v2) p_h2d;
    __typeof__(&cuMemcpyDtoH_v2) p_d2h;
    __typeof__(&cuModuleLoadData) p_load;
    __typeof__(&cuModuleGetFunction) p_getfn;
    __typeof__(&cuLaunchKernel) p_launch, p_launch_legacy;
    __typeof__(&cuStreamSynchronize) p_ssync;
    __typeof__(&cuGetProcAddress) p_oldgpa;
    __typeof__(&cuCtxSynchronize) p_csync = NULL;

    GET(p_init, "cuInit", 2000, 0);
    GET(p_ver, "cuDriverGetVersion", 2020, 0);
    GET(p_devget, "cuDeviceGet", 2000, 0);
    GET(p_ctxcreate, "cuCtxCreate", 12050, 0);
    GET(p_ctxdestroy, "cuCtxDestroy", 4000, 0);
    GET(p_alloc, "cuMemAlloc", 3020, 0);
    GET(p_free, "cuMemFree", 3020, 0);
    GET(p_h2d, "cuMemcpyHtoD", 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(p_d2h, "cuMemcpyDtoH", 3020, CU_GET_PROC_ADDRESS_DEFAULT);
    GET(p_load, "cuModuleLoadData", 2000, 0);
    GET(p_getfn, "cuModuleGetFunction", 2000, 0);
    GET(p_launch, "cuLaunchKernel", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(p_launch_legacy, "cuLaunchKernel", 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    GET(p_ssync, "cuStreamSynchronize", 2000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(p_oldgpa, "cuGetProcAddress", 11030, 0);
    CK(p_oldgpa("cuCtxSynchronize", (void **)&p_csync, 2000, 0)); /* old signature */

    /* ABI checks the tests look at */
    printf("PTSZ_OK %d\n", (void *)p_launch == dlsym(h, "cuLaunchKernel_ptsz") &&
                               (void *)p_launch_legacy == dlsym(h, "cuLaunchKernel") &&
                               (void *)p_h2d == dlsym(h, "cuMemcpyHtoD_v2_ptds"));
    printf("V2_OK %d\n", (void *)p_alloc == dlsym(h, "cuMemAlloc_v2") && (void *)p_ctxcreate == dlsym(h, "cuCtxCreate_v4") &&
                             (void *)p_oldgpa == dlsym(h, "cuGetProcAddress"));
    void *junk = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gpa("cuNoSuchFunction", &junk, 13000, 0, &st);
    printf("UNKNOWN %d %d %d\n", (int)r, (int)st, junk == NULL);
    r = gpa("cuLaunchKernelEx", &junk, 11000, 0, &st);
    printf("TOO_OLD %d %d\n", (int)r, (int)st);

    enum { N = 1024 };
    static float hbuf[N];
    int version;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    CK(p_init(0));
    CK(p_ver(&version));
    CK(p_devget(&dev, 0));
    CK(p_ctxcreate(&ctx, NULL, 0, dev));
    CK(p_alloc(&d, sizeof hbuf));
    for (int i = 0; i < N; i++) hbuf[i] = (float)i;
    CK(p_h2d(d, hbuf, sizeof hbuf));
    CK(p_load(&mod, MODULE_TEXT));
    CK(p_getfn(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    for (int i = 0; i < iters; i++)
        LAUNCH((i % 2 ? p_launch_legacy : p_launch)(f, 4, 1, 1, 256, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL));
    CK(p_ssync(CU_STREAM_PER_THREAD));
    CK(p_csync());
    CK(p_d2h(hbuf, d, sizeof hbuf));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += hbuf[i];
    CK(p_free(d));
    CK(p_ctxdestroy(ctx));
    printf("DRIVER %d\n", version);
    printf("CHECKSUM %.1f\n", sum);
    printf("LAUNCHES %ld\n", g_launches);
    return 0;
}
