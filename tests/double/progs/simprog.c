/* simprog.c -- loads a PTX module (argv[1]; its entries run the double's host kernels of the same
 * names) and runs several kernels on small buffers: fill, add_one (twice: cuLaunchKernel, then
 * cuLaunchKernelEx), saxpy, tile_sum (shared memory
 * and barriers), histo (atomics), chase (a pointer table in device memory); reads every result
 * back. argv[2] = "ends" also stores a one-past-the-end pointer in the table (not read by chase):
 * a value no replay can prove to be a pointer into one allocation. argv[2] = "frac": fractional
 * float data, so that a fused saxpy (one rounding) and the double's unfused one differ in the last bit. */
#include <string.h>
#include "common.h"

enum { N = 4096, T = 256, NB = 16, NT = 4 };

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: simprog FILE.ptx [ends]\n"); return 2; }
    int ends = argc > 2 && strcmp(argv[2], "ends") == 0;
    int frac = argc > 2 && strcmp(argv[2], "frac") == 0;
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 2; }
    static char ptx[1 << 16];
    size_t len = fread(ptx, 1, sizeof ptx - 1, fp);
    fclose(fp);
    ptx[len] = 0;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_fill, f_add, f_saxpy, f_tile, f_histo, f_chase;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuModuleGetFunction(&f_saxpy, mod, "saxpy"));
    CK(cuModuleGetFunction(&f_tile, mod, "tile_sum"));
    CK(cuModuleGetFunction(&f_histo, mod, "histo"));
    CK(cuModuleGetFunction(&f_chase, mod, "chase"));

    static float x[N], y[N];
    static int iv[N];
    static unsigned hv[N];
    for (int i = 0; i < N; i++) { x[i] = (float)(i % 97); y[i] = (float)(i % 13); iv[i] = i % 1000 - 300; hv[i] = (unsigned)(i * 2654435761u >> 7); }
    CUdeviceptr dx, dy, du, di, dsum, dh, dbins, dt[NT], table, out;
    CK(cuMemAlloc(&dx, sizeof x));
    CK(cuMemAlloc(&dy, sizeof y));
    CK(cuMemAlloc(&du, N * 4));
    CK(cuMemAlloc(&di, sizeof iv));
    CK(cuMemAlloc(&dsum, NB * 4));
    CK(cuMemAlloc(&dh, sizeof hv));
    CK(cuMemAlloc(&dbins, 64 * 4));
    CK(cuMemcpyHtoD(dx, x, sizeof x));
    CK(cuMemcpyHtoD(dy, y, sizeof y));
    CK(cuMemcpyHtoD(di, iv, sizeof iv));
    CK(cuMemcpyHtoD(dh, hv, sizeof hv));
    CK(cuMemsetD32(dbins, 0, 64));

    int n = N, nbins = 64;
    unsigned v = 0xC0FFEE;
    float a = frac ? 1.1f : 3.0f;
    if (frac)
        for (int i = 0; i < N; i++) { x[i] = (float)(i % 97) * 0.1f + 0.37f; y[i] = (float)(i % 13) * 0.3f; }
    void *pf[] = {&du, &v, &n};
    LAUNCH(cuLaunchKernel(f_fill, NB, 1, 1, T, 1, 1, 0, NULL, pf, NULL));
    void *pa[] = {&dx, &n};
    LAUNCH(cuLaunchKernel(f_add, NB, 1, 1, T, 1, 1, 0, NULL, pa, NULL));
    void *ps[] = {&a, &dx, &dy, &n};
    LAUNCH(cuLaunchKernel(f_saxpy, NB, 1, 1, T, 1, 1, 0, NULL, ps, NULL));
    CUlaunchConfig cfg;                 /* add_one again, through cuLaunchKernelEx (no attributes) */
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = NB; cfg.gridDimY = 1; cfg.gridDimZ = 1;
    cfg.blockDimX = T; cfg.blockDimY = 1; cfg.blockDimZ = 1;
    LAUNCH(cuLaunchKernelEx(&cfg, f_add, pa, NULL));
    void *pt[] = {&di, &dsum, &n};
    LAUNCH(cuLaunchKernel(f_tile, NB, 1, 1, T, 1, 1, 0, NULL, pt, NULL));
    void *ph[] = {&dh, &dbins, &n, &nbins};
    LAUNCH(cuLaunchKernel(f_histo, NB, 1, 1, T, 1, 1, 0, NULL, ph, NULL));

    unsigned long long marks[NT], ptrs[NT + 1], got[NT];
    for (int i = 0; i < NT; i++) {
        CK(cuMemAlloc(&dt[i], 256));
        marks[i] = 0xC0DE0000ULL + (unsigned long long)i * 7919;
        CK(cuMemcpyHtoD(dt[i] + 8 * i, &marks[i], 8));
        ptrs[i] = dt[i] + 8 * i;
    }
    ptrs[NT] = dt[NT - 1] + 256;          /* one past the end of the last buffer */
    CK(cuMemAlloc(&table, sizeof ptrs));
    CK(cuMemAlloc(&out, sizeof got));
    CK(cuMemcpyHtoD(table, ptrs, (ends ? NT + 1 : NT) * 8));
    int nt = NT;
    void *pc[] = {&table, &out, &nt};
    LAUNCH(cuLaunchKernel(f_chase, 1, 1, 1, 32, 1, 1, 0, NULL, pc, NULL));

    static unsigned ru[N], rbins[64];
    static int rsum[NB];
    CK(cuMemcpyDtoH(ru, du, sizeof ru));
    CK(cuMemcpyDtoH(x, dx, sizeof x));
    CK(cuMemcpyDtoH(y, dy, sizeof y));
    CK(cuMemcpyDtoH(rsum, dsum, sizeof rsum));
    CK(cuMemcpyDtoH(rbins, dbins, sizeof rbins));
    CK(cuMemcpyDtoH(got, out, sizeof got));
    int ok = ru[5] == v && (frac || (x[5] == 7.0f && y[5] == 3.0f * 6.0f + 5.0f)) && got[2] == marks[2];
    long total = 0;
    for (int i = 0; i < 64; i++) total += rbins[i];
    ok &= total == N;
    CK(cuModuleUnload(mod));
    printf("SIMPROG %s\n", ok ? "OK" : "BAD");
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
