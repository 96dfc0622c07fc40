/* h2d_double.c -- end-to-end recorder throughput without a GPU.
 * dlopens libcuda.so.1 (the test double on LD_LIBRARY_PATH, or a real driver), allocates
 * SIZE_MB (default 256) MiB of device memory and does N (default 8) cuMemcpyHtoD_v2 of that
 * size from a random (incompressible) host buffer whose content changes in one word per
 * 4 MiB between copies (no chunk dedup). Times the copy loop only.
 *   usage: h2d_double [N] [SIZE_MB]      prints: H2D <n> x <bytes> in <s> s = <GB/s> GB/s
 *                                                and CPU <seconds of this process>
 * Build: cc -O2 -o h2d_double bench/h2d_double.c -ldl */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *need(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) { fprintf(stderr, "h2d_double: missing %s\n", name); exit(2); }
    return p;
}

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "h2d_double: %s = %d\n", #x, r_); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    size_t size = (size_t)(argc > 2 ? atoi(argv[2]) : 256) << 20;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "h2d_double: %s\n", dlerror()); return 2; }
    CUresult (*cuInit)(unsigned) = need(h, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = need(h, "cuDeviceGet");
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, CUdevice) = need(h, "cuCtxCreate_v2");
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t) = need(h, "cuMemAlloc_v2");
    CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t) = need(h, "cuMemcpyHtoD_v2");
    CUresult (*cuMemFree_v2)(CUdeviceptr) = need(h, "cuMemFree_v2");
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate_v2(&ctx, 0, dev));
    CK(cuMemAlloc_v2(&d, size));
    uint64_t *buf = malloc(size);
    if (!buf) return 2;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < size / 8; i++) {       /* xorshift64: incompressible */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        buf[i] = x;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int it = 0; it < n; it++) {
        for (size_t off = 0; off < size / 8; off += (4u << 20) / 8) buf[off] += (uint64_t)it + 1;
        CK(cuMemcpyHtoD_v2(d, buf, size));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    printf("H2D %d x %zu in %.3f s = %.2f GB/s\n", n, size, s, (double)n * (double)size / s / 1e9);
    printf("CPU %.3f\n", cpu);     /* this process, whole run (user + sys) */
    CK(cuMemFree_v2(d));
    free(buf);
    return 0;
}
