/*
 * libcuda_double.c -- the cudasnap TEST DOUBLE of the CUDA driver (libcuda.so.1).
 *
 * A test double, not a driver: it implements a small part of the CUDA Driver API
 * in host memory so that CI machines without a GPU can run cudasnap's real shim,
 * recorder, snapshot format and replayer end to end.  It is built by
 * tests/double/build.py into a private directory and is never shipped or
 * installed by the cudasnap package.
 *
 * Model: device memory is host memory.  Device pointers are host addresses
 * (cuMemAlloc places mappings in an internal arena, by default at
 * 0x200000000000, or at $CUDA_DOUBLE_ALLOC_BASE), so the built-in "kernels"
 * (double_launch.c) are host functions that dereference them.  Everything runs
 * synchronously; streams and events are bookkeeping only.
 *
 * This file: handle registry, errors, init/devices/contexts, memory (linear,
 * host, managed, async, VMM), copies and memsets, streams, events and graphs.
 * double_launch.c: modules, libraries, kernels, launches.
 * double_proc.c: cuGetProcAddress tables.
 */
#define _GNU_SOURCE
#include "double_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

pthread_mutex_t dbl_lock = PTHREAD_MUTEX_INITIALIZER;

/* The ABI layouts cuda_double.h must match (CUDA 13.0, LP64). */
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "CUmemAllocationProp.win32HandleMetaData");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8, "CUlaunchAttribute");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32 && offsetof(CUlaunchConfig, numAttrs) == 48 &&
               sizeof(CUlaunchConfig) == 56, "CUlaunchConfig");
_Static_assert(sizeof(CUuuid) == 16 && sizeof(CUdeviceptr) == 8, "CUuuid/CUdeviceptr");

#define MIB (1024ULL * 1024ULL)
#define GRANULARITY (2 * MIB)
#define TOTAL_MEM (80ULL * 1024ULL * MIB)
#define DEFAULT_ARENA_BASE 0x200000000000ULL
#define DEVICE_NAME "cudasnap test double"

/* ------------------------------------------------------------------ handles */
static void **objs;
static size_t nobjs, capobjs;

/* Freed function objects are handed out again, newest first, so a handle value names another
 * kernel after its module is unloaded, as the real driver's do. */
static void *spare_funcs[256];
static size_t nspare_funcs;

void *obj_new(int type, size_t size) {
    int *o = NULL;
    if (type == OBJ_FUNC) {
        LOCK();
        if (nspare_funcs) o = spare_funcs[--nspare_funcs];
        UNLOCK();
        if (o) memset(o, 0, size);
    }
    if (!o) o = calloc(1, size < sizeof(int) ? sizeof(int) : size);
    if (!o) return NULL;
    *o = type;
    LOCK();
    if (nobjs == capobjs) {
        capobjs = capobjs ? capobjs * 2 : 64;
        objs = realloc(objs, capobjs * sizeof(void *));
    }
    objs[nobjs++] = o;
    UNLOCK();
    return o;
}

/* Where recent lookups found their objects: a lookup looks near those first, so that programs
 * holding many handles (a graph's event record nodes: their events read or destroyed in order,
 * between lookups of the same stream and function) do not scan the whole registry each time. */
static size_t obj_hints[4];
static unsigned obj_hint_next;

static int obj_find_locked(const void *p, size_t *at) {
    for (unsigned h = 0; h < 4; h++) {
        size_t c = obj_hints[h];
        for (size_t i = c > 2 ? c - 2 : 0; i < nobjs && i <= c + 2; i++)
            if (objs[i] == p) { *at = obj_hints[h] = i; return 1; }
    }
    for (size_t i = nobjs; i-- > 0;)
        if (objs[i] == p) { *at = obj_hints[obj_hint_next++ % 4] = i; return 1; }
    return 0;
}

static int obj_check_locked(const void *p, int type) {
    size_t i;
    if (!p || !obj_find_locked(p, &i)) return 0;
    return *(const int *)p == type;
}

int obj_check(const void *p, int type) {
    LOCK();
    int r = obj_check_locked(p, type);
    UNLOCK();
    return r;
}

void obj_free(void *p) {
    LOCK();
    size_t i;
    if (p && obj_find_locked(p, &i)) {
        objs[i] = objs[--nobjs];
        int func = *(int *)p == OBJ_FUNC;
        *(int *)p = 0;
        if (func && nspare_funcs < sizeof spare_funcs / sizeof *spare_funcs) spare_funcs[nspare_funcs++] = p;
        else free(p);
    }
    UNLOCK();
}

/* ------------------------------------------------------------------- errors */
static const struct { CUresult code; const char *name, *text; } errtab[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in the current state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error) { *pStr = errtab[i].name; return CUDA_SUCCESS; }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errtab / sizeof errtab[0]; i++)
        if (errtab[i].code == error) { *pStr = errtab[i].text; return CUDA_SUCCESS; }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------- init / devices */
static int initialized;

CUresult need_init(void) { return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    initialized = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) return r_; } while (0)
/* CUDA_DOUBLE_DEVICES=N (1..8, default 1): that many devices, all in the same host memory;
 * every device reaches every other as a peer. */
#define MAX_DEVICES 8
int double_ndev(void) {
    static int n;
    if (!n) {
        const char *e = getenv("CUDA_DOUBLE_DEVICES");
        int v = e && *e ? atoi(e) : 1;
        n = v < 1 ? 1 : v > MAX_DEVICES ? MAX_DEVICES : v;
    }
    return n;
}
#define CHECK_DEV(d) do { CHECK(need_init()); if ((d) < 0 || (d) >= double_ndev()) return CUDA_ERROR_INVALID_DEVICE; } while (0)

API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CHECK(need_init());
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= double_ndev()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count) {
    CHECK(need_init());
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = double_ndev();
    return CUDA_SUCCESS;
}

API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    CHECK_DEV(dev);
    CHECK_DEV(peerDev);
    if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CHECK_DEV(dev);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", DEVICE_NAME);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    CHECK_DEV(dev);
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, "cudasnap-double!", 16);
    uuid->bytes[15] = (char)('!' + dev);        /* device 0 keeps the historic UUID */
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CHECK_DEV(dev);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = TOTAL_MEM;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x1b; break;
    case 20:     /* CU_DEVICE_ATTRIBUTE_COMPUTE_MODE; DOUBLE_COMPUTE_MODE=3: exclusive process */
        v = getenv("DOUBLE_COMPUTE_MODE") ? atoi(getenv("DOUBLE_COMPUTE_MODE")) : 0; break;
    default: v = 0;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */
struct ctx_obj { int type; CUdevice dev; unsigned int flags; int primary; int refs; int active; unsigned peers; };
static struct ctx_obj *primary_ctxs[MAX_DEVICES];
#define primary_ctx primary_ctxs[dev]
static __thread CUcontext ctx_stack[64];
static __thread int ctx_depth;

CUresult need_ctx(void) {
    CHECK(need_init());
    if (ctx_depth == 0 || !ctx_stack[ctx_depth - 1]) return CUDA_ERROR_INVALID_CONTEXT;
    struct ctx_obj *c = (struct ctx_obj *)ctx_stack[ctx_depth - 1];
    if (!obj_check(c, OBJ_CTX) || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!primary_ctx) {
        struct ctx_obj *c = obj_new(OBJ_CTX, sizeof *c);
        LOCK();
        if (!primary_ctx) { c->primary = 1; c->dev = dev; primary_ctx = c; c = NULL; }
        UNLOCK();
        if (c) obj_free(c);
    }
    LOCK();
    primary_ctx->refs++;
    primary_ctx->active = 1;
    UNLOCK();
    *pctx = (CUcontext)primary_ctx;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return primary_retain(pctx, dev); }

/* Not a driver entry point: the primary context's handle reached the way the CUDA runtime
 * reaches it, through a path no interception sees, before it is retained (not active yet). */
API CUresult double_private_primary_ctx(CUcontext *pctx, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!primary_ctx) {
        struct ctx_obj *c = obj_new(OBJ_CTX, sizeof *c);
        LOCK();
        if (!primary_ctx) { c->primary = 1; c->dev = dev; primary_ctx = c; c = NULL; }
        UNLOCK();
        if (c) obj_free(c);
    }
    *pctx = (CUcontext)primary_ctx;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CHECK_DEV(dev);
    LOCK();
    CUresult r = CUDA_SUCCESS;
    if (!primary_ctx || primary_ctx->refs <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--primary_ctx->refs == 0) primary_ctx->active = 0;
    UNLOCK();
    return r;
}

API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    CHECK_DEV(dev);
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    *flags = primary_ctx ? primary_ctx->flags : 0;
    *active = primary_ctx ? primary_ctx->active : 0;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CHECK_DEV(dev);
    if (primary_ctx) primary_ctx->flags = flags;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CHECK_DEV(dev);
    if (primary_ctx) { primary_ctx->refs = 0; primary_ctx->active = 0; }
    return CUDA_SUCCESS;
}

API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (ctx_depth >= 64) return CUDA_ERROR_OUT_OF_MEMORY;
    struct ctx_obj *c = obj_new(OBJ_CTX, sizeof *c);
    c->dev = dev;
    c->flags = flags;
    c->active = 1;
    ctx_stack[ctx_depth++] = (CUcontext)c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int numParams, unsigned int flags, CUdevice dev) {
    (void)params; (void)numParams;
    return cuCtxCreate_v2(pctx, flags, dev);
}

API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    (void)params;
    return cuCtxCreate_v2(pctx, flags, dev);
}

API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CHECK(need_init());
    struct ctx_obj *c = (struct ctx_obj *)ctx;
    if (!obj_check(c, OBJ_CTX) || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == ctx) ctx_stack[i] = NULL;
    while (ctx_depth > 0 && !ctx_stack[ctx_depth - 1]) ctx_depth--;
    obj_free(c);
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx) {
    CHECK(need_init());
    if (ctx && !obj_check(ctx, OBJ_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) {
        if (ctx) ctx_stack[ctx_depth++] = ctx;
    } else if (ctx) {
        ctx_stack[ctx_depth - 1] = ctx;
    } else {
        ctx_depth--;
    }
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CHECK(need_init());
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CHECK(need_init());
    if (!obj_check(ctx, OBJ_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= 64) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CHECK(need_init());
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

/* A global-mode stream capture in progress forbids synchronous work in every thread, as the
 * driver does: the call fails and the capture is invalidated (its end reports it). */
static int capture_global_n, capture_broken;
static CUresult capture_forbids(void) {
    if (!__atomic_load_n(&capture_global_n, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    __atomic_store_n(&capture_broken, 1, __ATOMIC_RELEASE);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

API CUresult cuCtxSynchronize(void) { CHECK(need_ctx()); return capture_forbids(); }

/* Profiler control: nothing to start or stop; with CUDA_DOUBLE_PROFILER_LOG=FILE each call
 * appends "cuProfilerStart OPS" / "cuProfilerStop OPS" (OPS: launches, copies and memsets
 * run so far), so tests see where a tool's collection range would fall. */
static CUresult profiler_log(const char *what) {
    CHECK(need_ctx());
    const char *path = getenv("CUDA_DOUBLE_PROFILER_LOG");
    if (path && *path) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "%s %llu\n", what, __atomic_load_n(&dbl_ops, __ATOMIC_RELAXED));
            fclose(f);
        }
    }
    return CUDA_SUCCESS;
}
API CUresult cuProfilerStart(void) { return profiler_log("cuProfilerStart"); }
API CUresult cuProfilerStop(void) { return profiler_log("cuProfilerStop"); }

API CUresult cuCtxGetDevice(CUdevice *device) {
    CHECK(need_ctx());
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = ((struct ctx_obj *)ctx_stack[ctx_depth - 1])->dev;
    return CUDA_SUCCESS;
}

/* CUDA 13.0 forms taking the context explicitly (NULL: the current one). */
API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    if (!ctx) return need_ctx();
    CHECK(need_init());
    return obj_check(ctx, OBJ_CTX) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    CHECK(cuCtxSynchronize_v2(ctx));
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) return cuCtxGetDevice(device);
    *device = ((struct ctx_obj *)ctx)->dev;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    CHECK(need_init());
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    if (ctx && !obj_check(ctx, OBJ_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 12050;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetFlags(unsigned int *flags) {
    CHECK(need_ctx());
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = ((struct ctx_obj *)ctx_stack[ctx_depth - 1])->flags;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ memory table */
enum { R_ALLOC = 1, R_HOST, R_RESERVE, R_MAP, R_IPC, R_HOSTREG };   /* R_HOSTREG: a registered host range */
struct memh_obj { int type; int fd; size_t size; int released; int nmaps; unsigned handle_types; };
typedef struct region {
    unsigned long long base;
    size_t size, maplen;
    int kind, accessible;
    struct memh_obj *h;
} region_t;
static region_t *regs;
static size_t nregs, capregs;
static size_t mem_used;
static unsigned long long arena_base;

static void reg_add(region_t r) {
    if (nregs == capregs) {
        capregs = capregs ? capregs * 2 : 64;
        regs = realloc(regs, capregs * sizeof *regs);
    }
    regs[nregs++] = r;
}

static void reg_del(size_t i) { regs[i] = regs[--nregs]; }

static region_t *reg_containing(unsigned long long p, int want_access) {
    for (size_t i = 0; i < nregs; i++) {
        region_t *r = &regs[i];
        if (p < r->base || p >= r->base + r->maplen) continue;
        if (want_access && r->kind == R_RESERVE) continue;
        if (want_access && r->kind == R_MAP && !r->accessible) continue;
        return r;
    }
    return NULL;
}

int dev_range_ok(unsigned long long p, size_t n) {
    int ok = 1;
    LOCK();
    while (n > 0) {
        region_t *r = reg_containing(p, 1);
        if (!r) { ok = 0; break; }
        unsigned long long end = r->base + r->maplen;
        size_t chunk = (size_t)(end - p) < n ? (size_t)(end - p) : n;
        p += chunk;
        n -= chunk;
    }
    UNLOCK();
    return ok;
}

static int overlaps(unsigned long long a, size_t len, unsigned long long *next) {
    for (size_t i = 0; i < nregs; i++) {
        region_t *r = &regs[i];
        if (r->kind == R_MAP || r->kind == R_HOST) continue; /* maps lie inside reservations */
        if (a < r->base + r->maplen && r->base < a + len) {
            if (next) *next = r->base + r->maplen;
            return 1;
        }
    }
    return 0;
}

static unsigned long long align_up(unsigned long long v, unsigned long long a) { return (v + a - 1) / a * a; }

static void arena_init(void) {
    if (arena_base) return;
    const char *e = getenv("CUDA_DOUBLE_ALLOC_BASE");
    unsigned long long b = e && *e ? strtoull(e, NULL, 0) : 0;
    arena_base = b ? align_up(b, 4096) : DEFAULT_ARENA_BASE;
}

/* Find and map a free range of the arena the way a driver's VA allocator would:
 * lowest free address at or above the arena base.  Called with the lock held. */
static unsigned long long va_alloc(size_t len, size_t align, int prot) {
    arena_init();
    unsigned long long cand = align_up(arena_base, align), next;
    for (int tries = 0; tries < 100000; tries++) {
        if (overlaps(cand, len, &next)) { cand = align_up(next, align); continue; }
        void *p = mmap((void *)cand, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == (void *)cand) return cand;
        if (p != MAP_FAILED) munmap(p, len); /* kernel without MAP_FIXED_NOREPLACE */
        cand = align_up(cand + (len > GRANULARITY ? len : GRANULARITY), align); /* foreign mapping: skip */
    }
    return 0;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size) {
    CHECK(need_ctx());
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t maplen = align_up(size, 4096);
    size_t align = size >= GRANULARITY ? GRANULARITY : 4096;
    LOCK();
    if (mem_used + maplen > TOTAL_MEM) { UNLOCK(); return CUDA_ERROR_OUT_OF_MEMORY; }
    unsigned long long p = va_alloc(maplen, align, PROT_READ | PROT_WRITE);
    if (p) {
        reg_add((region_t){p, size, maplen, R_ALLOC, 1, NULL});
        mem_used += maplen;
    }
    UNLOCK();
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = p;
    return CUDA_SUCCESS;
}

static CUresult mem_free(unsigned long long p, int kind) {
    CHECK(need_init());
    if (!p) return CUDA_SUCCESS;
    LOCK();
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].base == p && regs[i].kind == kind) {
            munmap((void *)p, regs[i].maplen);
            if (kind == R_ALLOC) mem_used -= regs[i].maplen;
            if (kind == R_ALLOC && regs[i].h) { close(regs[i].h->fd); free(regs[i].h); }   /* shared by IPC */
            reg_del(i);
            UNLOCK();
            return CUDA_SUCCESS;
        }
    UNLOCK();
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    CHECK(need_ctx());
    if (!free_ || !total) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    *free_ = TOTAL_MEM - mem_used;
    UNLOCK();
    *total = TOTAL_MEM;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return mem_alloc(dptr, size); }
CUresult dbl_mem_alloc(CUdeviceptr *dptr, size_t size) { return mem_alloc(dptr, size); }
CUresult dbl_mem_free(CUdeviceptr dptr) { return mem_free(dptr, R_ALLOC); }
API CUresult cuMemFree_v2(CUdeviceptr dptr) { return mem_free(dptr, R_ALLOC); }

API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height, unsigned int elem) {
    if (!pPitch || (elem != 4 && elem != 8 && elem != 16) || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = align_up(width, 512);
    CHECK(mem_alloc(dptr, pitch * height));
    *pPitch = pitch;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    return mem_alloc(dptr, size);
}

API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    CHECK(stream_validate(s));
    return mem_alloc(dptr, size);
}
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) { return cuMemAllocAsync(dptr, size, s); }

API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    CHECK(stream_validate(s));
    return mem_free(dptr, R_ALLOC);
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return cuMemFreeAsync(dptr, s); }

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    CHECK(need_ctx());
    LOCK();
    region_t *r = reg_containing(dptr, 1);
    if (r && pbase) *pbase = r->base;
    if (r && psize) *psize = r->size;
    UNLOCK();
    return r ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* Memory type (host allocations HOST, device memory DEVICE) and the allocation's range;
 * anything else (pageable host memory) is unknown to the driver. */
API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    CHECK(need_init());
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    region_t *r = reg_containing(ptr, 1);
    region_t reg = r ? *r : (region_t){0};
    UNLOCK();
    if (!reg.kind) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = reg.kind == R_HOST || reg.kind == R_HOSTREG ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = reg.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = reg.size; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    CHECK(need_ctx());
    if (!pp || size == 0 || flags > 7) return CUDA_ERROR_INVALID_VALUE;
    size_t maplen = align_up(size, 4096);
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    LOCK();
    reg_add((region_t){(unsigned long long)p, size, maplen, R_HOST, 1, NULL});
    UNLOCK();
    *pp = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
API CUresult cuMemFreeHost(void *p) { return mem_free((unsigned long long)p, R_HOST); }
/* page-locking is meaningless on host memory: checked and accepted (replay's staging uses it) */
API CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    CHECK(need_ctx());
    if (!p || size == 0 || flags > 15) return CUDA_ERROR_INVALID_VALUE;
    LOCK();   /* remembered (not owned) so cuMemHostGetDevicePointer knows it, as the driver does */
    reg_add((region_t){(unsigned long long)p, size, size, R_HOSTREG, 1, NULL});
    UNLOCK();
    return CUDA_SUCCESS;
}
API CUresult cuMemHostUnregister(void *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].base == (unsigned long long)p && regs[i].kind == R_HOSTREG) { reg_del(i); break; }
    UNLOCK();
    return CUDA_SUCCESS;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags) {
    CHECK(need_ctx());
    if (!pdptr || flags) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    region_t *r = reg_containing((unsigned long long)p, 1);
    int ok = r && (r->kind == R_HOST || r->kind == R_HOSTREG);
    UNLOCK();
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------- copies and memsets */
unsigned long long dbl_ops;

CUresult op_run(const op_t *op) {
    if (op->kind >= 2 && op->kind <= 4) __atomic_add_fetch(&dbl_ops, 1, __ATOMIC_RELAXED);
    switch (op->kind) {
    case 1: return launch_run(op->func, op->grid, op->block, op->params, op->params_len);
    case 2: memmove((void *)op->dst, (const void *)op->src, op->n); return CUDA_SUCCESS;
    case 3: memset((void *)op->dst, (int)(op->value & 0xff), op->n); return CUDA_SUCCESS;
    case 4: {
        unsigned int *d = (unsigned int *)op->dst;
        for (size_t i = 0; i < op->n; i++) d[i] = op->value;
        return CUDA_SUCCESS;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* dcheck: bit 0 = dst is device memory, bit 1 = src is device memory. */
static CUresult do_copy(unsigned long long dst, unsigned long long src, size_t n, int dcheck, CUstream s, int async) {
    CHECK(need_ctx());
    if (async) CHECK(stream_validate(s));
    if (n == 0) return CUDA_SUCCESS;
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    if ((dcheck & 1) && !dev_range_ok(dst, n)) return CUDA_ERROR_INVALID_VALUE;
    if ((dcheck & 2) && !dev_range_ok(src, n)) return CUDA_ERROR_INVALID_VALUE;
    op_t op = {.kind = 2, .dst = dst, .src = src, .n = n};
    if (async && stream_capture_append(s, &op)) return CUDA_SUCCESS;
    if (!async) CHECK(capture_forbids());
    return op_run(&op);
}

/* Peer access: bookkeeping only (every device reaches all memory); refused as the driver
 * refuses it: a context of the same device, twice, or disabling what was not enabled. */
static CUresult peer_access(CUcontext peer, int enable) {
    CHECK(need_ctx());
    struct ctx_obj *c = (struct ctx_obj *)ctx_stack[ctx_depth - 1], *p = (struct ctx_obj *)peer;
    if (!obj_check(p, OBJ_CTX) || !p->active) return CUDA_ERROR_INVALID_CONTEXT;
    if (p->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    unsigned bit = 1u << p->dev;
    if (enable && (c->peers & bit)) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (!enable && !(c->peers & bit)) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    c->peers ^= bit;
    return CUDA_SUCCESS;
}

API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    return Flags ? CUDA_ERROR_INVALID_VALUE : peer_access(peerContext, 1);
}
API CUresult cuCtxDisablePeerAccess(CUcontext peerContext) { return peer_access(peerContext, 0); }

API CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n) {
    if (!obj_check(dctx, OBJ_CTX) || !obj_check(sctx, OBJ_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
    return do_copy(dst, src, n, 3, NULL, 0);
}
API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream st) {
    if (!obj_check(dctx, OBJ_CTX) || !obj_check(sctx, OBJ_CTX)) return CUDA_ERROR_INVALID_CONTEXT;
    return do_copy(dst, src, n, 3, st, 1);
}

static CUresult do_set(unsigned long long dst, unsigned int v, size_t n, int width, CUstream s, int async) {
    CHECK(need_ctx());
    if (async) CHECK(stream_validate(s));
    if (n == 0) return CUDA_SUCCESS;
    if (!dev_range_ok(dst, n * (size_t)width) || (width == 4 && (dst & 3))) return CUDA_ERROR_INVALID_VALUE;
    op_t op = {.kind = width == 1 ? 3 : 4, .dst = dst, .n = n, .value = v};
    if (async && stream_capture_append(s, &op)) return CUDA_SUCCESS;
    return op_run(&op);
}

#define U(x) ((unsigned long long)(uintptr_t)(x))
API CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, s, n, 0, NULL, 0); }
API CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, s, n, 0, NULL, 0); }
API CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, s, n, 0, st, 1); }
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, s, n, 0, st, 1); }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, U(s), n, 1, NULL, 0); }
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n) { return do_copy(d, U(s), n, 1, NULL, 0); }
API CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return do_copy(U(d), s, n, 2, NULL, 0); }
API CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n) { return do_copy(U(d), s, n, 2, NULL, 0); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, s, n, 3, NULL, 0); }
API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n) { return do_copy(d, s, n, 3, NULL, 0); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, U(s), n, 1, st, 1); }
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st) { return do_copy(d, U(s), n, 1, st, 1); }
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(U(d), s, n, 2, st, 1); }
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(U(d), s, n, 2, st, 1); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, s, n, 3, st, 1); }
API CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return do_copy(d, s, n, 3, st, 1); }
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, n, 1, NULL, 0); }
API CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return do_set(d, v, n, 1, NULL, 0); }
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, n, 4, NULL, 0); }
API CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return do_set(d, v, n, 4, NULL, 0); }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) { return do_set(d, v, n, 1, st, 1); }
API CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream st) { return do_set(d, v, n, 1, st, 1); }
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream st) { return do_set(d, v, n, 4, st, 1); }
API CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream st) { return do_set(d, v, n, 4, st, 1); }

/* ---------------------------------------------------------------------- VMM */
static CUresult check_prop(const CUmemAllocationProp *prop) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= double_ndev()) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) {
    CHECK(need_init());
    if (!gran || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(check_prop(prop));
    *gran = GRANULARITY;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    CHECK(need_ctx());
    if (!ptr || size == 0 || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    if (alignment && (alignment & (alignment - 1))) return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    unsigned long long p = 0;
    LOCK();
    if (addr && addr % 4096 == 0 && !overlaps(addr, size, NULL)) {
        void *m = mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (m == (void *)addr) p = addr;
        else if (m != MAP_FAILED) munmap(m, size);
    }
    if (!p) p = va_alloc(size, align, PROT_NONE); /* hint not honoured: like the driver, place it elsewhere */
    if (p) reg_add((region_t){p, size, size, R_RESERVE, 0, NULL});
    UNLOCK();
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = p;
    return CUDA_SUCCESS;
}

static void unmap_region_locked(size_t i) {
    region_t *r = &regs[i];
    mmap((void *)r->base, r->maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    struct memh_obj *h = r->h;
    reg_del(i);
    if (h && --h->nmaps == 0 && h->released) {
        mem_used -= h->size;
        for (size_t k = 0; k < nobjs; k++)
            if (objs[k] == h) { objs[k] = objs[--nobjs]; break; }
        free(h);
    }
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CHECK(need_init());
    LOCK();
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].kind == R_RESERVE && regs[i].base == ptr && regs[i].size == size) {
            reg_del(i);
            for (size_t k = nregs; k-- > 0;)
                if (regs[k].kind == R_MAP && regs[k].base >= ptr && regs[k].base < ptr + size) unmap_region_locked(k);
            munmap((void *)ptr, size);
            UNLOCK();
            return CUDA_SUCCESS;
        }
    UNLOCK();
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    CHECK(need_ctx());
    if (!handle || size == 0 || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    CHECK(check_prop(prop));
    LOCK();
    int full = mem_used + size > TOTAL_MEM;
    UNLOCK();
    if (full) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("cudasnap-test-double", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct memh_obj *h = obj_new(OBJ_MEMHANDLE, sizeof *h);
    h->fd = fd;
    h->size = size;
    h->handle_types = (unsigned)prop->requestedHandleTypes;
    LOCK();
    mem_used += size;
    UNLOCK();
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

/* Shareable handles: a POSIX fd is a duplicate of the allocation's memfd, so another process
 * that receives it (SCM_RIGHTS) maps the same memory; only for allocations created with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested, as the driver wants. */
API CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                          CUmemAllocationHandleType handleType, unsigned long long flags) {
    CHECK(need_init());
    struct memh_obj *h = (struct memh_obj *)(uintptr_t)handle;
    if (!shareableHandle || flags) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult r = CUDA_SUCCESS;
    if (!obj_check_locked(h, OBJ_MEMHANDLE) || h->released) r = CUDA_ERROR_INVALID_HANDLE;
    else if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(h->handle_types & handleType))
        r = CUDA_ERROR_NOT_SUPPORTED;
    int fd = r == CUDA_SUCCESS ? dup(h->fd) : -1;
    UNLOCK();
    if (r == CUDA_SUCCESS && fd < 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) *(int *)shareableHandle = fd;
    return r;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                            CUmemAllocationHandleType shHandleType) {
    CHECK(need_ctx());
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct memh_obj *h = obj_new(OBJ_MEMHANDLE, sizeof *h);
    h->fd = own;
    h->size = (size_t)st.st_size;
    h->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

/* Legacy IPC: cuIpcGetMemHandle turns a cuMemAlloc allocation into shared memory in place (a
 * memfd holding its bytes, mapped over it) and names it by (pid, fd); another process opens
 * /proc/PID/fd/FD and maps it where the driver would put it. VMM and pool memory are refused
 * (CUDA_ERROR_INVALID_VALUE), as by the driver. The handle's first 8 bytes are "CDIPC". */
typedef struct { char magic[8]; int pid, fd; unsigned long long size, maplen; } ipc_handle_t;

API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    CHECK(need_ctx());
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    region_t *r = NULL;
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].kind == R_ALLOC && dptr >= regs[i].base && dptr < regs[i].base + regs[i].maplen) r = &regs[i];
    CUresult res = r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r && !r->h) {
        int fd = memfd_create("cudasnap-test-double-ipc", MFD_CLOEXEC);
        struct memh_obj *h = fd >= 0 ? calloc(1, sizeof *h) : NULL;
        if (!h || ftruncate(fd, (off_t)r->maplen) != 0 || pwrite(fd, (void *)r->base, r->maplen, 0) != (ssize_t)r->maplen
            || mmap((void *)r->base, r->maplen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != (void *)r->base) {
            if (fd >= 0) close(fd);
            free(h);
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            h->type = OBJ_MEMHANDLE; h->fd = fd; h->size = r->maplen;
            r->h = h;
        }
    }
    if (res == CUDA_SUCCESS) {
        ipc_handle_t ih;
        memset(pHandle, 0, sizeof *pHandle);
        memset(&ih, 0, sizeof ih);
        memcpy(ih.magic, "CDIPC", 6);
        ih.pid = (int)getpid(); ih.fd = r->h->fd; ih.size = r->size; ih.maplen = r->maplen;
        memcpy(pHandle, &ih, sizeof ih);
    }
    UNLOCK();
    return res;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    CHECK(need_ctx());
    ipc_handle_t ih;
    memcpy(&ih, &handle, sizeof ih);
    if (!pdptr || memcmp(ih.magic, "CDIPC", 6) != 0 || !(flags & 1)) return CUDA_ERROR_INVALID_VALUE;
    if (ih.pid == (int)getpid()) return CUDA_ERROR_INVALID_CONTEXT;    /* a process cannot open its own */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    LOCK();
    unsigned long long p = va_alloc(ih.maplen, GRANULARITY, PROT_NONE);
    CUresult res = CUDA_ERROR_OUT_OF_MEMORY;
    struct memh_obj *h = calloc(1, sizeof *h);
    if (p && h && mmap((void *)p, ih.maplen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == (void *)p) {
        h->type = OBJ_MEMHANDLE; h->fd = fd; h->size = ih.maplen;
        reg_add((region_t){p, ih.size, ih.maplen, R_IPC, 1, h});
        *pdptr = p;
        res = CUDA_SUCCESS;
    } else {
        if (p) munmap((void *)p, ih.maplen);
        free(h);
        close(fd);
    }
    UNLOCK();
    return res;
}

API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) { return ipc_open(pdptr, handle, flags); }
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) { return ipc_open(pdptr, handle, flags); }

API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    CHECK(need_init());
    LOCK();
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].kind == R_IPC && regs[i].base == dptr) {
            munmap((void *)dptr, regs[i].maplen);
            close(regs[i].h->fd);
            free(regs[i].h);
            reg_del(i);
            UNLOCK();
            return CUDA_SUCCESS;
        }
    UNLOCK();
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CHECK(need_init());
    struct memh_obj *h = (struct memh_obj *)(uintptr_t)handle;
    LOCK();
    if (!obj_check_locked(h, OBJ_MEMHANDLE) || h->released) { UNLOCK(); return CUDA_ERROR_INVALID_VALUE; }
    h->released = 1;
    close(h->fd);
    h->fd = -1;
    if (h->nmaps == 0) {
        mem_used -= h->size;
        for (size_t k = 0; k < nobjs; k++)
            if (objs[k] == h) { objs[k] = objs[--nobjs]; break; }
        free(h);
    }
    UNLOCK();
    return CUDA_SUCCESS;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CHECK(need_ctx());
    struct memh_obj *h = (struct memh_obj *)(uintptr_t)handle;
    if (flags || size == 0 || ptr % GRANULARITY || size % GRANULARITY || offset % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult r = CUDA_SUCCESS;
    region_t *res = NULL;
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].kind == R_RESERVE && ptr >= regs[i].base && ptr + size <= regs[i].base + regs[i].size) res = &regs[i];
    if (!obj_check_locked(h, OBJ_MEMHANDLE) || h->released) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!res || offset + size > h->size) r = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < nregs; i++)
        if (regs[i].kind == R_MAP && regs[i].base < ptr + size && ptr < regs[i].base + regs[i].maplen) r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS) {
        void *m = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
        if (m != (void *)ptr) r = CUDA_ERROR_MAP_FAILED;
        else {
            reg_add((region_t){ptr, size, size, R_MAP, 0, h});
            h->nmaps++;
        }
    }
    UNLOCK();
    return r;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CHECK(need_init());
    int found = 0;
    LOCK();
    for (size_t k = nregs; k-- > 0;)
        if (regs[k].kind == R_MAP && regs[k].base >= ptr && regs[k].base + regs[k].maplen <= ptr + size) {
            unmap_region_locked(k);
            found = 1;
        }
    UNLOCK();
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CHECK(need_ctx());
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0
            || desc[i].location.id >= double_ndev()) return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) prot = PROT_READ;
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) return CUDA_ERROR_INVALID_VALUE;
    }
    LOCK();
    /* the whole range must be mapped */
    size_t covered = 0;
    for (size_t i = 0; i < nregs; i++)
        if (regs[i].kind == R_MAP && regs[i].base >= ptr && regs[i].base + regs[i].maplen <= ptr + size) covered += regs[i].maplen;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (covered == size && mprotect((void *)ptr, size, prot) == 0) {
        for (size_t i = 0; i < nregs; i++)
            if (regs[i].kind == R_MAP && regs[i].base >= ptr && regs[i].base + regs[i].maplen <= ptr + size)
                regs[i].accessible = prot != PROT_NONE;
        r = CUDA_SUCCESS;
    }
    UNLOCK();
    return r;
}

/* --------------------------------------------------------- streams, events */
/* ops run in order; nodes[i] (graphs built node by node) is the node of ops[node->index]; an
 * executable graph's src is the graph it was instantiated from */
enum { OP_EMPTY = 6 };                     /* an empty graph node: nothing to run */
struct gnode_obj;
struct graph_obj { int type; op_t *ops; int nops, cap; int global; struct gnode_obj **nodes; int nnodes, capnodes;
                   struct graph_obj *src; };
struct stream_obj { int type; unsigned int flags; int priority; struct graph_obj *capture; };
struct event_obj { int type; unsigned int flags; int recorded; struct timespec t; };

CUresult stream_validate(CUstream s) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_SUCCESS;
    return obj_check(s, OBJ_STREAM) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static void graph_append(struct graph_obj *g, const op_t *op) {
    if (g->nops == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 16;
        g->ops = realloc(g->ops, (size_t)g->cap * sizeof(op_t));
    }
    op_t *o = &g->ops[g->nops++];
    *o = *op;
    if (op->params_len) {
        o->params = malloc(op->params_len);
        memcpy(o->params, op->params, op->params_len);
    }
}

int stream_capture_append(CUstream s, const op_t *op) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return 0;
    LOCK();
    struct stream_obj *so = (struct stream_obj *)s;
    int captured = obj_check_locked(so, OBJ_STREAM) && so->capture;
    if (captured) graph_append(so->capture, op);
    UNLOCK();
    return captured;
}

void op_release(op_t *op) { free(op->params); op->params = NULL; }

API CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority) {
    CHECK(need_ctx());
    if (!ph || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    struct stream_obj *s = obj_new(OBJ_STREAM, sizeof *s);
    s->flags = flags;
    s->priority = priority;
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamCreate(CUstream *ph, unsigned int flags) { return cuStreamCreateWithPriority(ph, flags, 0); }

API CUresult cuStreamDestroy_v2(CUstream s) {
    CHECK(need_init());
    if (!obj_check(s, OBJ_STREAM)) return CUDA_ERROR_INVALID_HANDLE;
    obj_free(s);
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream s) { CHECK(need_ctx()); return stream_validate(s); }

/* A batch of copies: streams run at once here, so each copy is done in order; every end must be
 * device memory or host memory the process can reach (the double's device memory is host memory). */
API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream s) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!count || !dsts || !srcs || !sizes || (numAttrs && (!attrs || !attrsIdxs)) || !numAttrs) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (sizes[i]) memmove((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
    return CUDA_SUCCESS;
}

/* Host functions: streams run at once here, so the function runs now; on a capturing stream it
 * becomes a node of its own (an empty op: the double keeps no host nodes' functions). */
API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *user) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    op_t op = {.kind = OP_EMPTY};
    if (stream_capture_append(s, &op)) return CUDA_SUCCESS;
    fn(user);
    return CUDA_SUCCESS;
}
API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *user) { return cuLaunchHostFunc(s, fn, user); }

API CUresult cuStreamAddCallback(CUstream s, CUstreamCallback cb, void *user, unsigned int flags) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!cb || flags) return CUDA_ERROR_INVALID_VALUE;
    cb(s, CUDA_SUCCESS, user);
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
API CUresult cuStreamQuery(CUstream s) { CHECK(need_ctx()); return stream_validate(s); }
API CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }

/* Stream memory operations on device memory. Work here is done when its call returns, so a
 * wait whose condition does not hold yet would wait forever: it fails (CUDA_ERROR_NOT_READY). */
static CUresult memop_write(CUstream s, CUdeviceptr addr, unsigned long long v, size_t n) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!dev_range_ok(addr, n)) return CUDA_ERROR_INVALID_VALUE;
    if (n == 4) { uint32_t w = (uint32_t)v; memcpy((void *)(uintptr_t)addr, &w, 4); }
    else memcpy((void *)(uintptr_t)addr, &v, 8);
    return CUDA_SUCCESS;
}

static CUresult memop_wait(CUstream s, CUdeviceptr addr, unsigned long long v, unsigned flags, size_t n) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!dev_range_ok(addr, n)) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long cur = 0;
    if (n == 4) { uint32_t w; memcpy(&w, (void *)(uintptr_t)addr, 4); cur = w; }
    else memcpy(&cur, (void *)(uintptr_t)addr, 8);
    int ok;
    switch (flags & 3) {        /* GEQ (wrapping), EQ, AND, NOR */
    case 0: ok = n == 4 ? (int32_t)((uint32_t)cur - (uint32_t)v) >= 0 : (int64_t)(cur - v) >= 0; break;
    case 1: ok = cur == v; break;
    case 2: ok = (cur & v) != 0; break;
    default: ok = ~(cur | v) != 0; break;
    }
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

API CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) { (void)f; return memop_write(s, a, v, 4); }
API CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) { (void)f; return memop_write(s, a, v, 8); }
API CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) { return memop_wait(s, a, v, f, 4); }
API CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) { return memop_wait(s, a, v, f, 8); }
API CUresult cuStreamWriteValue32_v2_ptsz(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) { return cuStreamWriteValue32_v2(s, a, v, f); }
API CUresult cuStreamWriteValue64_v2_ptsz(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) { return cuStreamWriteValue64_v2(s, a, v, f); }
API CUresult cuStreamWaitValue32_v2_ptsz(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f) { return cuStreamWaitValue32_v2(s, a, v, f); }
API CUresult cuStreamWaitValue64_v2_ptsz(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f) { return cuStreamWaitValue64_v2(s, a, v, f); }

API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!obj_check(e, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    return flags > 1 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) { return cuStreamWaitEvent(s, e, flags); }

API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    CHECK(need_ctx());
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if ((unsigned)mode > 2) return CUDA_ERROR_INVALID_VALUE;
    struct graph_obj *g = obj_new(OBJ_GRAPH, sizeof *g);
    LOCK();
    struct stream_obj *so = (struct stream_obj *)s;
    CUresult r = CUDA_SUCCESS;
    if (!obj_check_locked(so, OBJ_STREAM)) r = CUDA_ERROR_INVALID_HANDLE;
    else if (so->capture) r = CUDA_ERROR_ILLEGAL_STATE;
    else so->capture = g;
    UNLOCK();
    if (r != CUDA_SUCCESS) obj_free(g);
    else if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
        ((struct graph_obj *)g)->global = 1;
        __atomic_add_fetch(&capture_global_n, 1, __ATOMIC_ACQ_REL);
    }
    return r;
}
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return cuStreamBeginCapture_v2(s, m); }
API CUresult cuStreamBeginCapture(CUstream s) { return cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
API CUresult cuStreamBeginCapture_ptsz(CUstream s) { return cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }

static void graph_free(struct graph_obj *g);

API CUresult cuStreamEndCapture(CUstream s, CUgraph *ph) {
    CHECK(need_ctx());
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct stream_obj *so = (struct stream_obj *)s;
    CUresult r = CUDA_SUCCESS;
    struct graph_obj *drop = NULL;
    if (!obj_check_locked(so, OBJ_STREAM)) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!so->capture) r = CUDA_ERROR_ILLEGAL_STATE;
    else {
        struct graph_obj *g = so->capture;
        so->capture = NULL;
        if (g->global && __atomic_sub_fetch(&capture_global_n, 1, __ATOMIC_ACQ_REL) == 0
            && __atomic_exchange_n(&capture_broken, 0, __ATOMIC_ACQ_REL)) {
            drop = g;                       /* invalidated: no graph comes out */
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else *ph = (CUgraph)g;
    }
    UNLOCK();
    if (drop) graph_free(drop);
    return r;
}
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *ph) { return cuStreamEndCapture(s, ph); }

API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    LOCK();
    if (obj_check_locked(s, OBJ_STREAM) && ((struct stream_obj *)s)->capture) *st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    UNLOCK();
    return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) { return cuStreamIsCapturing(s, st); }

API CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
    CHECK(need_ctx());
    if (!ph || flags > 7) return CUDA_ERROR_INVALID_VALUE;
    struct event_obj *e = obj_new(OBJ_EVENT, sizeof *e);
    e->flags = flags;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent ev, CUstream s) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!obj_check(ev, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    struct event_obj *e = (struct event_obj *)ev;
    dbl_clock_now(&e->t);
    e->recorded = 1;
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }

/* CU_EVENT_RECORD_EXTERNAL on a capturing stream: an event record node (stamped when the graph runs). */
API CUresult cuEventRecordWithFlags(CUevent ev, CUstream s, unsigned int flags) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!obj_check(ev, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    if (flags > CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_EVENT_RECORD_EXTERNAL) {
        op_t op = {0};
        op.kind = OP_EVENT_RECORD;
        op.func = ev;
        if (stream_capture_append(s, &op)) return CUDA_SUCCESS;
    }
    return cuEventRecord(ev, s);
}
API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int f) { return cuEventRecordWithFlags(e, s, f); }

/* IPC events: the handle names the exporter (pid) and its event ("CDIPCEV"). Work here is done
 * when its call returns, so an opened event is one whose work has completed. As the driver
 * asks, only an interprocess event without timing is exported, and a process cannot open its own. */
typedef struct { char magic[8]; int pid; unsigned long long event; } ipc_event_handle_t;

API CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent ev) {
    CHECK(need_ctx());
    if (!pHandle || !obj_check(ev, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    struct event_obj *e = (struct event_obj *)ev;
    if ((e->flags & (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)) != (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    ipc_event_handle_t ih;
    memset(pHandle, 0, sizeof *pHandle);
    memset(&ih, 0, sizeof ih);
    memcpy(ih.magic, "CDIPCEV", 8);
    ih.pid = (int)getpid();
    ih.event = (unsigned long long)(uintptr_t)ev;
    memcpy(pHandle, &ih, sizeof ih);
    return CUDA_SUCCESS;
}

API CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle) {
    CHECK(need_ctx());
    ipc_event_handle_t ih;
    memcpy(&ih, &handle, sizeof ih);
    if (!phEvent || memcmp(ih.magic, "CDIPCEV", 8) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (ih.pid == (int)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
    struct event_obj *e = obj_new(OBJ_EVENT, sizeof *e);
    e->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    e->recorded = 1;
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

API CUresult cuEventQuery(CUevent e) {
    CHECK(need_init());
    return obj_check(e, OBJ_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
API CUresult cuEventSynchronize(CUevent e) { return cuEventQuery(e); }

API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    CHECK(need_ctx());
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(a, OBJ_EVENT) || !obj_check(b, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    struct event_obj *ea = (struct event_obj *)a, *eb = (struct event_obj *)b;
    if (!ea->recorded || !eb->recorded || (ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)(eb->t.tv_sec - ea->t.tv_sec) * 1e3 + (double)(eb->t.tv_nsec - ea->t.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

API CUresult cuEventDestroy_v2(CUevent e) {
    CHECK(need_init());
    if (!obj_check(e, OBJ_EVENT)) return CUDA_ERROR_INVALID_HANDLE;
    obj_free(e);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------- graphs */
static void graph_free(struct graph_obj *g) {
    for (int i = 0; i < g->nops; i++) op_release(&g->ops[i]);
    for (int i = 0; i < g->nnodes; i++) obj_free(g->nodes[i]);
    free(g->ops);
    free(g->nodes);
    obj_free(g);
}

API CUresult cuGraphCreate(CUgraph *ph, unsigned int flags) {
    CHECK(need_ctx());
    if (!ph || flags) return CUDA_ERROR_INVALID_VALUE;
    *ph = (CUgraph)obj_new(OBJ_GRAPH, sizeof(struct graph_obj));
    return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *ph, CUgraph hg, unsigned long long flags) {
    CHECK(need_ctx());
    (void)flags;
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(hg, OBJ_GRAPH)) return CUDA_ERROR_INVALID_HANDLE;
    struct graph_obj *g = (struct graph_obj *)hg;
    struct graph_obj *x = obj_new(OBJ_GRAPHEXEC, sizeof *x);
    LOCK();
    for (int i = 0; i < g->nops; i++) graph_append(x, &g->ops[i]);
    x->src = g;
    UNLOCK();
    *ph = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec hx, CUstream s) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    if (!obj_check(hx, OBJ_GRAPHEXEC)) return CUDA_ERROR_INVALID_HANDLE;
    struct graph_obj *x = (struct graph_obj *)hx;
    for (int i = 0; i < x->nops; i++) {
        const op_t *op = &x->ops[i];
        if (op->kind == OP_EMPTY) continue;
        if (op->kind == OP_EVENT_RECORD) {          /* event record node: the event's time is now */
            struct event_obj *e = (struct event_obj *)op->func;
            if (e->type != OBJ_EVENT) return CUDA_ERROR_INVALID_HANDLE;    /* (no registry scan per node) */
            dbl_clock_now(&e->t);
            e->recorded = 1;
            continue;
        }
        CHECK(op_run(op));
    }
    return CUDA_SUCCESS;
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec hx, CUstream s) { return cuGraphLaunch(hx, s); }

API CUresult cuGraphDestroy(CUgraph g) {
    CHECK(need_init());
    if (!obj_check(g, OBJ_GRAPH)) return CUDA_ERROR_INVALID_HANDLE;
    graph_free((struct graph_obj *)g);
    return CUDA_SUCCESS;
}

API CUresult cuGraphExecDestroy(CUgraphExec x) {
    CHECK(need_init());
    if (!obj_check(x, OBJ_GRAPHEXEC)) return CUDA_ERROR_INVALID_HANDLE;
    graph_free((struct graph_obj *)x);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------- graphs built node by node */
/* Each node adds one op to its graph; ops run in the order their nodes were added, so a
 * dependency must point forward (an edge to an earlier node is CUDA_ERROR_NOT_SUPPORTED).
 * An executable graph holds a copy of the ops: node i of the graph is op i of the exec. */
enum { OBJ_GRAPHNODE = 64 };
#define NODE_PARAMS_MAX 256                /* double_launch.c's MAXPARAMS */
struct gnode_obj { int type; struct graph_obj *g; int index; };
CUresult kernel_node_op(const CUDA_KERNEL_NODE_PARAMS *p, op_t *op, unsigned char *pb);   /* double_launch.c */

static CUresult memset_node_op(const CUDA_MEMSET_NODE_PARAMS *p, op_t *op) {
    if (!p || !p->width || !p->height) return CUDA_ERROR_INVALID_VALUE;
    if (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) return CUDA_ERROR_INVALID_VALUE;
    if (p->elementSize == 2) return CUDA_ERROR_NOT_SUPPORTED;                  /* no 16-bit memset op */
    size_t row = p->width * p->elementSize;
    if (p->height > 1 && p->pitch != row) return CUDA_ERROR_NOT_SUPPORTED;   /* pitched 2D: not modelled */
    if (!dev_range_ok(p->dst, row * p->height)) return CUDA_ERROR_INVALID_VALUE;
    *op = (op_t){.kind = p->elementSize == 1 ? 3 : 4, .dst = p->dst, .n = p->width * p->height, .value = p->value};
    return CUDA_SUCCESS;
}

static CUresult node_add(CUgraphNode *ph, CUgraph hg, const CUgraphNode *deps, size_t n, const op_t *op) {
    if (!ph || (n && !deps)) return CUDA_ERROR_INVALID_VALUE;
    struct graph_obj *g = (struct graph_obj *)hg;
    CUresult r = CUDA_SUCCESS;
    LOCK();
    if (!obj_check_locked(g, OBJ_GRAPH)) r = CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        const struct gnode_obj *d = (const struct gnode_obj *)deps[i];
        if (!obj_check_locked(d, OBJ_GRAPHNODE) || d->g != g) r = CUDA_ERROR_INVALID_VALUE;
    }
    UNLOCK();
    if (r != CUDA_SUCCESS) return r;
    struct gnode_obj *node = obj_new(OBJ_GRAPHNODE, sizeof *node);
    LOCK();
    if (g->nnodes == g->capnodes) {
        g->capnodes = g->capnodes ? 2 * g->capnodes : 16;
        g->nodes = realloc(g->nodes, (size_t)g->capnodes * sizeof *g->nodes);
    }
    g->nodes[g->nnodes++] = node;
    node->g = g;
    node->index = g->nops;
    graph_append(g, op);
    UNLOCK();
    *ph = (CUgraphNode)node;
    return CUDA_SUCCESS;
}

/* Replace a node's op in its graph (x NULL) or in an executable graph made from that graph. */
static CUresult node_set(CUgraphExec hx, CUgraphNode hn, const op_t *op) {
    struct gnode_obj *node = (struct gnode_obj *)hn;
    struct graph_obj *x = (struct graph_obj *)hx;
    CUresult r = CUDA_SUCCESS;
    LOCK();
    if (!obj_check_locked(node, OBJ_GRAPHNODE) || (x && !obj_check_locked(x, OBJ_GRAPHEXEC))) r = CUDA_ERROR_INVALID_HANDLE;
    else {
        struct graph_obj *g = x ? x : node->g;
        if ((x && x->src != node->g) || node->index >= g->nops || g->ops[node->index].kind != op->kind)
            r = CUDA_ERROR_INVALID_VALUE;
        else {
            op_t *o = &g->ops[node->index];
            op_release(o);
            *o = *op;
            o->params = NULL;
            if (op->params_len) {
                o->params = malloc(op->params_len);
                memcpy(o->params, op->params, op->params_len);
            }
        }
    }
    UNLOCK();
    return r;
}

API CUresult cuGraphAddKernelNode_v2(CUgraphNode *ph, CUgraph hg, const CUgraphNode *deps, size_t n,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK(need_ctx());
    unsigned char pb[NODE_PARAMS_MAX];
    op_t op;
    CHECK(kernel_node_op(p, &op, pb));
    return node_add(ph, hg, deps, n, &op);
}

API CUresult cuGraphAddMemsetNode(CUgraphNode *ph, CUgraph hg, const CUgraphNode *deps, size_t n,
                                  const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    CHECK(need_ctx());
    op_t op;
    CHECK(memset_node_op(p, &op));
    return node_add(ph, hg, deps, n, &op);
}

API CUresult cuGraphAddEmptyNode(CUgraphNode *ph, CUgraph hg, const CUgraphNode *deps, size_t n) {
    CHECK(need_ctx());
    op_t op = {.kind = OP_EMPTY};
    return node_add(ph, hg, deps, n, &op);
}

/* Kernel, memset and empty nodes; other node types are CUDA_ERROR_NOT_SUPPORTED.  Edge data is
 * ignored (ops run in the order added). */
API CUresult cuGraphAddNode_v2(CUgraphNode *ph, CUgraph hg, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                               size_t n, CUgraphNodeParams *p) {
    CHECK(need_ctx());
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    unsigned char pb[NODE_PARAMS_MAX];
    op_t op = {0};
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: CHECK(kernel_node_op(&p->kernel, &op, pb)); break;
    case CU_GRAPH_NODE_TYPE_MEMSET: CHECK(memset_node_op((const CUDA_MEMSET_NODE_PARAMS *)&p->memset, &op)); break;
    case CU_GRAPH_NODE_TYPE_EMPTY: op.kind = OP_EMPTY; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return node_add(ph, hg, deps, n, &op);
}

/* The nodes of a graph in the order they were made; a graph made by stream capture gets a node
 * object per captured op the first time it is asked.  Roots: the double keeps no edges, so the
 * first node stands for them (what a replay must map is the order, not the topology). */
static CUresult graph_nodes(CUgraph hg, CUgraphNode *out, size_t *count, int roots) {
    CHECK(need_ctx());
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    struct graph_obj *g = (struct graph_obj *)hg;
    LOCK();
    if (!obj_check_locked(g, OBJ_GRAPH)) { UNLOCK(); return CUDA_ERROR_INVALID_HANDLE; }
    UNLOCK();
    if (g->nnodes == 0 && g->nops > 0) {
        for (int i = 0; i < g->nops; i++) {
            struct gnode_obj *node = obj_new(OBJ_GRAPHNODE, sizeof *node);
            LOCK();
            if (g->nnodes == g->capnodes) {
                g->capnodes = g->capnodes ? 2 * g->capnodes : 16;
                g->nodes = realloc(g->nodes, (size_t)g->capnodes * sizeof *g->nodes);
            }
            node->g = g;
            node->index = i;
            g->nodes[g->nnodes++] = node;
            UNLOCK();
        }
    }
    size_t have = roots ? (g->nnodes > 0) : (size_t)g->nnodes;
    if (out) {
        size_t n = *count < have ? *count : have;
        for (size_t i = 0; i < n; i++) out[i] = (CUgraphNode)g->nodes[i];
        *count = n;
    } else {
        *count = have;
    }
    return CUDA_SUCCESS;
}

API CUresult cuGraphGetNodes(CUgraph hg, CUgraphNode *nodes, size_t *numNodes) { return graph_nodes(hg, nodes, numNodes, 0); }
API CUresult cuGraphGetRootNodes(CUgraph hg, CUgraphNode *nodes, size_t *n) { return graph_nodes(hg, nodes, n, 1); }

API CUresult cuGraphNodeGetType(CUgraphNode hn, CUgraphNodeType *type) {
    CHECK(need_ctx());
    const struct gnode_obj *node = (const struct gnode_obj *)hn;
    if (!type) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(node, OBJ_GRAPHNODE)) return CUDA_ERROR_INVALID_HANDLE;
    int kind = node->g->ops[node->index].kind;
    *type = kind == 1 ? CU_GRAPH_NODE_TYPE_KERNEL : kind == 2 ? CU_GRAPH_NODE_TYPE_MEMCPY
          : kind == 3 || kind == 4 ? CU_GRAPH_NODE_TYPE_MEMSET : kind == OP_EVENT_RECORD ? CU_GRAPH_NODE_TYPE_EVENT_RECORD
          : CU_GRAPH_NODE_TYPE_EMPTY;
    return CUDA_SUCCESS;
}

API CUresult cuGraphAddDependencies_v2(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to,
                                       const CUgraphEdgeData *edgeData, size_t n) {
    CHECK(need_ctx());
    if (n && (!from || !to)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    LOCK();
    if (!obj_check_locked(hg, OBJ_GRAPH)) r = CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
        const struct gnode_obj *a = (const void *)from[i], *b = (const void *)to[i];
        if (!obj_check_locked(a, OBJ_GRAPHNODE) || !obj_check_locked(b, OBJ_GRAPHNODE)
            || a->g != (struct graph_obj *)hg || b->g != (struct graph_obj *)hg || a == b)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (a->index > b->index) r = CUDA_ERROR_NOT_SUPPORTED;   /* ops run in the order added */
    }
    UNLOCK();
    return r;
}

API CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK(need_ctx());
    unsigned char pb[NODE_PARAMS_MAX];
    op_t op;
    CHECK(kernel_node_op(p, &op, pb));
    return node_set(NULL, hn, &op);
}

API CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hx, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    CHECK(need_ctx());
    unsigned char pb[NODE_PARAMS_MAX];
    op_t op;
    CHECK(kernel_node_op(p, &op, pb));
    return node_set(hx, hn, &op);
}
