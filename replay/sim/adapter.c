/* cudasnap's adapter for GPGPU-Sim: what a replay needs, on what the simulator implements.
   Modules come as one PTX file (cuLinkAddFile reads $PTX_JIT_PATH/<name>; the simulator takes
   one such file per process), kernels are registered with __cudaRegisterFunction, memory,
   copies and synchronization go through its Runtime API, launches through cuLaunchKernel with
   kernelParams (its `extra` path aborts). Build: cc -shared -fPIC adapter.c -L SIM/lib -lcudart.
   Device addresses are 64-bit integers here so that Python (cffi) and C agree on them. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "adapter.h"

typedef struct { unsigned x, y, z; } sim_dim3;
extern int cudaMalloc(void **p, size_t n);
extern int cudaFree(void *p);
extern int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
extern int cudaMemset(void *p, int v, size_t n);
extern int cudaDeviceSynchronize(void);
extern int cudaGetLastError(void);
extern int cuLinkAddFile_v2(void *state, int type, const char *path, unsigned n, void *opts, void **vals);
extern void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, void *tid, void *bid,
                                   sim_dim3 *bDim, sim_dim3 *gDim, int *wSize);
extern int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shm, void *stream, void **params, void **extra);

enum { H2D = 1, D2H = 2, D2D = 3, CU_JIT_INPUT_PTX = 1 };
static char jit_path[1 << 16];   /* the simulator strcat()s the file name onto getenv()'s buffer */

int sim_load_ptx(const char *dir, const char *file) {
    if (strlen(dir) + strlen(file) + 64 > sizeof jit_path) return 1;
    snprintf(jit_path, sizeof jit_path, "PTX_JIT_PATH=%s", dir);
    putenv(jit_path);
    return cuLinkAddFile_v2(NULL, CU_JIT_INPUT_PTX, file, 0, NULL, NULL);
}

/* The handle the simulator knows the kernel by: any unique host address (a copy of its name). */
void *sim_register(const char *name) {
    char *host = strdup(name);
    __cudaRegisterFunction((void **)1, host, host, host, -1, NULL, NULL, NULL, NULL, NULL);
    return host;
}

int sim_malloc(unsigned long long *p, size_t n) {
    void *d = NULL;
    int r = cudaMalloc(&d, n ? n : 1);
    *p = (unsigned long long)(size_t)d;
    return r;
}
int sim_free(unsigned long long p) { return cudaFree((void *)(size_t)p); }
int sim_h2d(unsigned long long dst, const void *src, size_t n) { return cudaMemcpy((void *)(size_t)dst, src, n, H2D); }
int sim_d2h(void *dst, unsigned long long src, size_t n) { return cudaMemcpy(dst, (const void *)(size_t)src, n, D2H); }
int sim_d2d(unsigned long long dst, unsigned long long src, size_t n) {
    return cudaMemcpy((void *)(size_t)dst, (const void *)(size_t)src, n, D2D);
}
int sim_memset8(unsigned long long p, int v, size_t n) { return cudaMemset((void *)(size_t)p, v, n); }
int sim_sync(void) { return cudaDeviceSynchronize(); }

/* The addresses of the n module globals the merged PTX's probe entry (`__cudasnap_globals`, see
   ptx.py) writes, in its order: the simulator's runtime has no lookup of a PTX variable by name. */
int sim_globals(unsigned long long *out, int n) {
    static void *probe;
    unsigned long long buf;
    unsigned off = 0;
    if (n <= 0) return 0;
    if (!probe) probe = sim_register("__cudasnap_globals");
    int r = sim_malloc(&buf, 8 * (size_t)n);
    if (!r) r = sim_launch(probe, 1, 1, 1, 1, 1, 1, 0, (unsigned char *)&buf, 1, &off);
    if (!r) r = sim_d2h(out, buf, 8 * (size_t)n);
    return r;
}

/* params: the packed parameter buffer; offsets[i]: where parameter i starts in it. Waits for
   the kernel, so that each launch's simulation (and its cycle count) ends before the next call. */
int sim_launch(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned shm, unsigned char *params, int nparams, const unsigned *offsets) {
    void *argv[512];
    if (nparams > 512) return 1;
    for (int i = 0; i < nparams; i++) argv[i] = params + offsets[i];
    int r = cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, shm, NULL, argv, NULL);
    if (r) return r;
    fflush(stdout);
    r = cudaDeviceSynchronize();
    fflush(stdout);
    return r;
}
