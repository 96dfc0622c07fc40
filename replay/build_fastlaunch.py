"""Build cudasnap.replay._fastlaunch: a tiny cffi extension that launches a batch of
pre-decoded kernel launches in one call (the replay engine's launch fast path).

No CUDA toolkit is needed: the module declares the few driver types itself and resolves
cuLaunchKernel at run time with dlopen("libcuda.so.1") + cuGetProcAddress_v2 (the same
library cuda-bindings loaded; the same entry point, version and flags it asks for)."""
from __future__ import annotations

from cffi import FFI

CDEF = """
typedef struct {
    uint64_t func;            /* live CUfunction */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shmem;
    uint64_t stream;          /* live CUstream (0, 1 legacy, 2 per-thread, or a handle) */
    const void *params;       /* packed parameter bytes (the `extra` buffer form) */
    size_t size;              /* 0: no parameters, NULL extra */
} fl_desc;

int fl_init(int cuda_version, unsigned long long flags, char *err, int errlen);
int64_t fl_launch(const fl_desc *descs, const uint32_t *idx, int64_t n, int *code,
                  double *t_first, double *t_last);
int64_t fl_current(void);
"""

SOURCE = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t func;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shmem;
    uint64_t stream;
    const void *params;
    size_t size;
} fl_desc;

typedef int fl_result;   /* CUresult */
typedef fl_result (*fl_launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, void *, void **, void **);
typedef fl_result (*fl_gpa_fn)(const char *, void **, int, unsigned long long, int *);

static fl_launch_fn fl_cuLaunchKernel;
static volatile int64_t fl_pos;   /* launch in progress (relative to the last fl_launch call) */

int64_t fl_current(void) { return fl_pos; }

static double fl_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);   /* what Python's time.monotonic() reads on Linux */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int fl_init(int cuda_version, unsigned long long flags, char *err, int errlen) {
    if (fl_cuLaunchKernel) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) { snprintf(err, errlen, "dlopen libcuda.so.1: %s", dlerror()); return 1; }
    fl_gpa_fn gpa = (fl_gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { snprintf(err, errlen, "libcuda.so.1 has no cuGetProcAddress_v2"); return 2; }
    void *p = NULL;
    int status = 0;
    fl_result r = gpa("cuLaunchKernel", &p, cuda_version, flags, &status);
    if (r != 0 || !p) { snprintf(err, errlen, "cuGetProcAddress_v2(cuLaunchKernel) returned %d", (int)r); return 3; }
    fl_cuLaunchKernel = (fl_launch_fn)p;
    return 0;
}

/* Launch descs[idx[i]] for i in [0, n); stop at the first failing launch.
   Returns the number launched (n when all succeeded; else the failing index, its CUresult
   in *code).  *t_first / *t_last: CLOCK_MONOTONIC after the first and the last launch. */
int64_t fl_launch(const fl_desc *descs, const uint32_t *idx, int64_t n, int *code,
                  double *t_first, double *t_last) {
    *code = 0;
    if (!fl_cuLaunchKernel) { *code = 3; return 0; }   /* CUDA_ERROR_NOT_INITIALIZED */
    int64_t i;
    for (i = 0; i < n; i++) {
        const fl_desc *d = &descs[idx[i]];
        fl_pos = i;
        size_t size = d->size;
        void *extra[5] = {(void *)1, (void *)d->params, (void *)2, &size, (void *)0};
        fl_result r = fl_cuLaunchKernel((void *)(uintptr_t)d->func, d->grid[0], d->grid[1], d->grid[2],
                                        d->block[0], d->block[1], d->block[2], d->shmem,
                                        (void *)(uintptr_t)d->stream, NULL, size ? extra : NULL);
        if (r != 0) { *code = (int)r; break; }
        if (i == 0) *t_first = fl_now();
    }
    if (i > 0) *t_last = fl_now();
    return i;
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.replay._fastlaunch", SOURCE, libraries=["dl"])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
