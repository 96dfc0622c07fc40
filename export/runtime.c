/*@section core*/
/* ------------------------------------------------------------------------------------------
 * Runtime of the exported program: placement, data files, copies with verification, launches
 * timed with CUDA events, and the summary.  Everything below the runtime is the recorded call
 * sequence, one driver call (or helper) per recorded call.
 * ---------------------------------------------------------------------------------------- */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define RT static __attribute__((unused))   /* runtime helpers: a program uses some */
#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)
#define IO_CHUNK ((size_t)64 << 20)
#define PARAM_MAX 32768

static int g_ordinal;                 /* -d N */
static CUdevice g_dev;
static int g_verbose, g_timing = 1;
static char g_dir[4096] = "data";
static long g_seq = -1;               /* the recorded call being replayed */
static const char *g_api = "";
static unsigned long long g_d2h_ok, g_d2h_bad, g_d2h_bytes, g_d2h_unverified;
static unsigned long long g_launches, g_calls, g_captured;
static CUresult (*p_ctx_create_v2)(CUcontext *, unsigned int, CUdevice);
static CUresult (*p_ctx_synchronize)(void);

static const char *res_name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "CUDA_ERROR_UNKNOWN";
    return s;
}

__attribute__((noreturn, format(printf, 1, 2))) RT void die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(2);
}

__attribute__((noreturn)) RT void fail(long seq, const char *api, CUresult r) {
    die("call #%ld %s returned %s (%d)", seq, api, res_name(r), (int)r);
}

/* AT: the recorded call about to be replayed (named in errors; printed with -v). */
#define AT(seq, api) (g_seq = (seq), g_api = (api), g_calls++, \
                      g_verbose ? (void)fprintf(stderr, "#%ld %s\n", (long)(seq), (api)) : (void)0)
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) fail(g_seq, g_api, r_); } while (0)
/* driver calls the runtime makes on its own account name themselves */
#define CKN(name, x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) fail(g_seq, name, r_); } while (0)

/* ---- relocations: module globals the loader placed elsewhere than recorded ---- */
typedef struct { CUdeviceptr rec, live; size_t n; } reloc_t;
static reloc_t g_reloc[256];
static int g_nreloc;
RT CUdeviceptr tr_slow(CUdeviceptr a) {
    for (int i = 0; i < g_nreloc; i++)
        if (a >= g_reloc[i].rec && a < g_reloc[i].rec + (g_reloc[i].n ? g_reloc[i].n : 1))
            return g_reloc[i].live + (a - g_reloc[i].rec);
    return a;
}
#define TR(a) (g_nreloc ? tr_slow((CUdeviceptr)(a)) : (CUdeviceptr)(a))

/* ---- data files ---- */
static FILE *open_data(const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) die("call #%ld %s: cannot open data file %s: %s", g_seq, g_api, p, strerror(errno));
    return f;
}

RT void read_exact(FILE *f, void *buf, size_t n, const char *name) {
    if (n && fread(buf, 1, n, f) != n) die("call #%ld %s: data file %s is shorter than expected", g_seq, g_api, name);
}

RT void expect_eof(FILE *f, const char *name) {
    if (fgetc(f) != EOF) die("call #%ld %s: data file %s is longer than expected", g_seq, g_api, name);
    fclose(f);
}

RT void *load_data(const char *name, size_t n, size_t pad) {
    FILE *f = open_data(name);
    unsigned char *buf = malloc(n + pad + 1);
    if (!buf) die("out of host memory (%zu bytes for %s)", n, name);
    read_exact(f, buf, n, name);
    memset(buf + n, 0, pad + 1);
    expect_eof(f, name);
    return buf;
}

/* ---- host buffers of asynchronous copies, kept until their stream or context is synchronized ---- */
typedef struct { void *p; CUstream s; size_t n; } kept_t;
static kept_t *g_kept;
static size_t g_nkept, g_capkept, g_kept_bytes;
static void ctx_sync(void);
/* stand-ins for the recorded process's host functions (they cannot run here): the stream still
 * waits at that point and a stream capture still gets its host node */
RT void host_noop(void *user) { (void)user; }
RT void callback_noop(CUstream s, CUresult r, void *user) { (void)s; (void)r; (void)user; }
RT void release_kept(CUstream s, int all) {
    size_t j = 0;
    for (size_t i = 0; i < g_nkept; i++) {
        if (all || g_kept[i].s == s) { free(g_kept[i].p); g_kept_bytes -= g_kept[i].n; }
        else g_kept[j++] = g_kept[i];
    }
    g_nkept = j;
}
RT void keep(void *p, size_t n, CUstream s, int forever) {
    if (forever) return;              /* a graph node reads or writes it whenever the graph runs */
    if (g_nkept == g_capkept) {
        g_capkept = g_capkept ? 2 * g_capkept : 64;
        g_kept = realloc(g_kept, g_capkept * sizeof *g_kept);
        if (!g_kept) die("out of host memory");
    }
    g_kept[g_nkept++] = (kept_t){p, s, n};
    g_kept_bytes += n;
    if (g_kept_bytes > ((size_t)2 << 30)) ctx_sync();
}

RT void ctx_sync(void) {
    CUcontext c = NULL;
    if (cuCtxGetCurrent(&c) == CUDA_SUCCESS && c) CKN("cuCtxSynchronize", p_ctx_synchronize());
    release_kept(NULL, 1);
}

RT void stream_sync(CUstream s) {
    CK(cuStreamSynchronize(s));
    release_kept(s, 0);
}

/* ---- copies ---- */
RT void h2d(CUdeviceptr dst, const char *name, size_t n, CUstream s, int async) {
    dst = TR(dst);
    if (async) {
        void *buf = load_data(name, n, 0);
        CK(cuMemcpyHtoDAsync(dst, buf, n, s));
        keep(buf, n, s, async == 2);
        return;
    }
    FILE *f = open_data(name);
    size_t cap = n < IO_CHUNK ? n : IO_CHUNK;
    void *buf = malloc(cap ? cap : 1);
    if (!buf) die("out of host memory");
    for (size_t off = 0; off < n;) {
        size_t m = n - off < cap ? n - off : cap;
        read_exact(f, buf, m, name);
        CK(cuMemcpyHtoD(dst + off, buf, m));
        off += m;
    }
    free(buf);
    expect_eof(f, name);
}

RT void verify(const unsigned char *got, const char *name, size_t n) {
    FILE *f = open_data(name);
    unsigned char *exp = malloc(n < IO_CHUNK ? (n ? n : 1) : IO_CHUNK);
    if (!exp) die("out of host memory");
    size_t bad = (size_t)-1;
    for (size_t off = 0; off < n && bad == (size_t)-1;) {
        size_t m = n - off < IO_CHUNK ? n - off : IO_CHUNK;
        read_exact(f, exp, m, name);
        if (memcmp(exp, got + off, m) != 0)
            for (size_t i = 0; i < m; i++)
                if (exp[i] != got[off + i]) { bad = off + i; break; }
        if (bad != (size_t)-1) {
            fprintf(stderr, "MISMATCH call #%ld %s (%zu bytes, %s): first difference at byte %zu: expected 0x%02x, got 0x%02x\n",
                    g_seq, g_api, n, name, bad, exp[bad - off], got[bad]);
            break;
        }
        off += m;
    }
    if (bad == (size_t)-1) { expect_eof(f, name); g_d2h_ok++; }
    else { fclose(f); g_d2h_bad++; }
    g_d2h_bytes += n;
    free(exp);
}

/* name NULL: the recorded result was not captured (counted, not verified); async 2: the copy is
   a node of a graph being captured (it runs when the graph runs; not verified) */
RT void d2h(CUdeviceptr src, const char *name, size_t n, CUstream s, int async) {
    unsigned char *got = malloc(n ? n : 1);
    if (!got) die("out of host memory");
    src = TR(src);
    if (async) {
        CK(cuMemcpyDtoHAsync(got, src, n, s));
        if (async == 2) { g_d2h_unverified++; return; }
        stream_sync(s);
    } else {
        CK(cuMemcpyDtoH(got, src, n));
    }
    if (name) verify(got, name, n);
    else g_d2h_unverified++;
    free(got);
}

/* ---- pinned host memory at its recorded address: kernels reach mapped memory by its host
 * address, and programs store that address in device memory. The ranges are held (PROT_NONE)
 * before the driver loads, then mapped and registered where the program pinned them. ---- */
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
enum { MAX_HOST_HELD = 4096 };
static unsigned long long g_held_lo[MAX_HOST_HELD];
static size_t g_held_len[MAX_HOST_HELD];
static int g_nheld;

RT void host_span(unsigned long long at, size_t n, unsigned long long *lo, size_t *len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    *lo = at - at % pg;
    *len = (size_t)(((at + (n ? n : 1) + pg - 1) / pg) * pg - *lo);
}

RT void host_reserve(unsigned long long at, size_t n) {
    unsigned long long lo;
    size_t len;
    host_span(at, n, &lo, &len);
    if (g_nheld == MAX_HOST_HELD) return;
    void *got = mmap((void *)(uintptr_t)lo, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (got == (void *)(uintptr_t)lo) {
        g_held_lo[g_nheld] = lo;
        g_held_len[g_nheld++] = len;
    } else if (got != MAP_FAILED) {
        munmap(got, len);
    }
}

RT int host_held(unsigned long long lo, size_t len) {
    for (int i = 0; i < g_nheld; i++)
        if (g_held_lo[i] <= lo && lo + len <= g_held_lo[i] + g_held_len[i]) return 1;
    return 0;
}

/* map and register [at, at+n) for the device; a taken address is said once and left out (copies
 * do not need it: their data comes from data/) */
RT void host_place(unsigned long long at, size_t n, unsigned portable) {
    unsigned long long lo;
    size_t len;
    host_span(at, n, &lo, &len);
    int fixed = host_held(lo, len) ? MAP_FIXED : MAP_FIXED_NOREPLACE;
    void *got = mmap((void *)(uintptr_t)lo, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | fixed, -1, 0);
    if (got != (void *)(uintptr_t)lo) {
        if (got != MAP_FAILED) munmap(got, len);
        fprintf(stderr, "replay: call #%ld: pinned host memory at 0x%llx (%zu bytes) is taken in this process: kernels "
                "reaching it by its recorded address will fault\n", g_seq, at, n);
        return;
    }
    /* CU_MEMHOSTREGISTER_DEVICEMAP (0x02), and _PORTABLE (0x01) as the program asked */
    CUresult r = cuMemHostRegister((void *)(uintptr_t)lo, len, 0x02u | (portable ? 0x01u : 0u));
    if (r != CUDA_SUCCESS) fail(g_seq, "cuMemHostRegister", r);
}

RT void host_unplace(unsigned long long at, size_t n) {
    unsigned long long lo;
    size_t len;
    host_span(at, n, &lo, &len);
    cuMemHostUnregister((void *)(uintptr_t)lo);
    if (host_held(lo, len))          /* back to a reservation of ours */
        mmap((void *)(uintptr_t)lo, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    else
        munmap((void *)(uintptr_t)lo, len);
}

/* ---- placement: the recorded address zone, physical memory mapped at recorded addresses ---- */
RT CUmemAllocationProp dev_prop(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = g_ordinal;
    return p;
}

RT void check_granularity(size_t planned) {
    CUmemAllocationProp p = dev_prop();
    size_t g = 0;
    CKN("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (!g || planned % g)
        die("placement: this device maps memory in granules of %zu bytes; the export planned %zu", g, planned);
}

/* the recorded zone must come back at its recorded address, or nothing lands where recorded */
RT void reserve_exact(CUdeviceptr at, size_t n, size_t align) {
    CUdeviceptr got = 0;
    CUresult r = cuMemAddressReserve(&got, n, align, at, 0);
    if (r != CUDA_SUCCESS) {          /* some drivers want a context for reservations */
        CUcontext c;
        CKN("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&c, g_dev));
        CKN("cuCtxSetCurrent", cuCtxSetCurrent(c));
        r = cuMemAddressReserve(&got, n, align, at, 0);
        CKN("cuCtxSetCurrent", cuCtxSetCurrent(NULL));
    }
    if (r != CUDA_SUCCESS) fail(g_seq, "cuMemAddressReserve", r);
    if (got != at) {
        cuMemAddressFree(got, n);
        die("placement: cuMemAddressReserve(0x%zx bytes at 0x%llx) returned 0x%llx: the recorded address range "
            "is not free in this process", n, (unsigned long long)at, (unsigned long long)got);
    }
}

RT void set_access(CUdeviceptr at, size_t n, unsigned flags) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = g_ordinal;
    d.flags = (CUmemAccess_flags)flags;
    CKN("cuMemSetAccess", cuMemSetAccess(at, n, &d, 1));
}

RT void mem_create(CUmemGenericAllocationHandle *h, size_t n) {
    CUmemAllocationProp p = dev_prop();
    CKN("cuMemCreate", cuMemCreate(h, n, &p, 0));
}

RT void mem_map(CUdeviceptr at, size_t n, CUmemGenericAllocationHandle h) {
    CKN("cuMemMap", cuMemMap(at, n, 0, h, 0));
}

/* ---- contexts ---- */
RT void resolve_abi(void) {
    /* entry points whose header name changed signature across CUDA versions are taken by their
       ABI symbol: cuCtxCreate_v2(ctx, flags, dev) and cuCtxSynchronize(void) */
    p_ctx_create_v2 = (CUresult(*)(CUcontext *, unsigned int, CUdevice))dlsym(RTLD_DEFAULT, "cuCtxCreate_v2");
    p_ctx_synchronize = (CUresult(*)(void))dlsym(RTLD_DEFAULT, "cuCtxSynchronize");
    if (!p_ctx_synchronize) die("libcuda does not export cuCtxSynchronize");
}

RT CUresult ctx_create(CUcontext *c, unsigned int flags) {
    if (!p_ctx_create_v2) die("libcuda does not export cuCtxCreate_v2");
    return p_ctx_create_v2(c, flags, g_dev);
}

/* ---- launch timing: a CUDA event pair around each launch, read back in batches ---- */
#define TPOOL 512
typedef struct { float *t; size_t n, cap; unsigned long long launches, untimed; } kstat_t;
static kstat_t g_ks[NKERNELS > 0 ? NKERNELS : 1];
static CUevent g_tev[2 * TPOOL];
static int g_tkid[TPOOL];
static int g_tn;
static CUcontext g_tctx;

RT void timing_flush(void) {
    for (int i = 0; i < g_tn; i++) {
        float ms = 0;
        kstat_t *k = &g_ks[g_tkid[i]];
        if (cuEventSynchronize(g_tev[2 * i + 1]) != CUDA_SUCCESS ||
            cuEventElapsedTime(&ms, g_tev[2 * i], g_tev[2 * i + 1]) != CUDA_SUCCESS) { k->untimed++; continue; }
        if (k->n == k->cap) {
            k->cap = k->cap ? 2 * k->cap : 16;
            k->t = realloc(k->t, k->cap * sizeof *k->t);
            if (!k->t) die("out of host memory");
        }
        k->t[k->n++] = ms * 1000.0f;
    }
    g_tn = 0;
}

/* before a context goes away: read what its events hold, then forget them */
RT void timing_drop(void) {
    timing_flush();
    for (int i = 0; i < 2 * TPOOL; i++)
        if (g_tev[i]) { cuEventDestroy(g_tev[i]); g_tev[i] = NULL; }
    g_tctx = NULL;
}

/* timed 0: the launch is captured into a graph (it runs when the graph runs) */
RT int timing_begin(int kid, CUstream s, int timed) {
    CUcontext c = NULL;
    if (!timed) return -1;
    if (!g_timing || cuCtxGetCurrent(&c) != CUDA_SUCCESS || !c) { g_ks[kid].untimed++; return -1; }
    if (c != g_tctx) { timing_drop(); g_tctx = c; }
    if (g_tn == TPOOL) timing_flush();
    int i = g_tn;
    for (int j = 0; j < 2; j++)
        if (!g_tev[2 * i + j]) CKN("cuEventCreate", cuEventCreate(&g_tev[2 * i + j], CU_EVENT_DEFAULT));
    CKN("cuEventRecord", cuEventRecord(g_tev[2 * i], s));
    return i;
}

RT void launched(int i, int kid, CUstream s, int timed) {
    if (!timed) { g_captured++; return; }
    g_ks[kid].launches++;
    g_launches++;
    if (i < 0) return;
    CKN("cuEventRecord", cuEventRecord(g_tev[2 * i + 1], s));
    g_tkid[i] = kid;
    g_tn = i + 1;
}

/* ---- launches: the recorded packed parameter bytes, passed through the `extra` buffer form ---- */
static _Alignas(16) unsigned char g_pbuf[PARAM_MAX];

RT void *params_live(const unsigned char *p, size_t n) {
    memcpy(g_pbuf, p, n);
    if (g_nreloc)
        for (size_t o = 0; o + 8 <= n; o += 8) {
            uint64_t v;
            memcpy(&v, g_pbuf + o, 8);
            uint64_t t = TR(v);
            memcpy(g_pbuf + o, &t, 8);
        }
    return g_pbuf;
}

RT void launch(int kid, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shm, CUstream s, const unsigned char *p, size_t n, int timed) {
    size_t size = n;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params_live(p, n), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    int t = timing_begin(kid, s, timed);
    CK(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, NULL, n ? extra : NULL));
    launched(t, kid, s, timed);
}

/* ---- the end ---- */
RT int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

RT void summary(void) {
    int order[NKERNELS > 0 ? NKERNELS : 1];
    double total[NKERNELS > 0 ? NKERNELS : 1];
    int nk = 0;
    for (int k = 0; k < NKERNELS; k++) {
        if (!g_ks[k].launches) continue;
        total[k] = 0;
        for (size_t i = 0; i < g_ks[k].n; i++) total[k] += g_ks[k].t[i];
        order[nk++] = k;
    }
    for (int i = 1; i < nk; i++)           /* by total time, longest first */
        for (int j = i; j > 0 && total[order[j]] > total[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    if (nk) {
        printf("%10s %14s %12s  %s\n", "launches", "total us", "median us", "kernel");
        for (int i = 0; i < nk; i++) {
            kstat_t *k = &g_ks[order[i]];
            double med = 0;
            if (k->n) {
                qsort(k->t, k->n, sizeof *k->t, cmp_float);
                med = k->n % 2 ? k->t[k->n / 2] : 0.5 * (k->t[k->n / 2 - 1] + k->t[k->n / 2]);
            }
            char untimed[64] = "";
            if (k->untimed) snprintf(untimed, sizeof untimed, " (%llu untimed)", k->untimed);
            printf("%10llu %14.1f %12.2f  %s%s\n", k->launches, total[order[i]], med, KERNEL_NAMES[order[i]], untimed);
        }
    }
}

RT void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [-d DEVICE] [-C DATADIR] [-n] [-v]\n"
                    "  Replays the recorded calls and verifies every device-to-host result.\n"
                    "  -d N  device ordinal (0)   -C DIR  data files (default: data/ beside the program)\n"
                    "  -n    no launch timing     -v      print each call as it is replayed\n"
                    "  exit: 0 verified, 1 a result differs, 2 cannot proceed\n", argv0);
    exit(2);
}

RT void default_dir(void) {
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
    snprintf(g_dir, sizeof g_dir, "%s/data", exe);
}

RT void options(int argc, char **argv) {
    default_dir();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-d") && i + 1 < argc) g_ordinal = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-C") && i + 1 < argc) snprintf(g_dir, sizeof g_dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "-n")) g_timing = 0;
        else if (!strcmp(argv[i], "-v")) g_verbose = 1;
        else usage(argv[0]);
    }
}

RT void start(void) {
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) die("cuInit returned %s (no usable GPU or driver?)", res_name(r));
    int n = 0;
    CKN("cuDeviceGetCount", cuDeviceGetCount(&n));
    if (g_ordinal < 0 || g_ordinal >= n) die("-d %d: only %d device(s) present", g_ordinal, n);
    CKN("cuDeviceGet", cuDeviceGet(&g_dev, g_ordinal));
    resolve_abi();
}

RT int finish(void) {
    g_seq = -1;
    g_api = "final synchronization";
    ctx_sync();
    timing_flush();
    summary();
    printf("calls replayed: %llu, launches: %llu", g_calls, g_launches);
    if (g_captured) printf(" (and %llu captured into graphs, run by their graph launches)", g_captured);
    printf("\n");
    if (g_d2h_unverified) printf("device-to-host results not verified: %llu (not captured, or inside a graph)\n", g_d2h_unverified);
    if (g_d2h_bad) {
        printf("FAILED: %llu of %llu device-to-host results differ\n", g_d2h_bad, g_d2h_bad + g_d2h_ok);
        return 1;
    }
    printf("OK: %llu device-to-host results verified (%llu bytes)\n", g_d2h_ok, g_d2h_bytes);
    return 0;
}
/*@end*/

/*@section globals*/
/* a module global: the loader chooses its address; copies and parameters that name the
   recorded one are translated */
RT void global_at(CUdeviceptr rec, CUdeviceptr live, size_t n) {
    if (rec == live || !rec) return;
    if (g_nreloc == (int)(sizeof g_reloc / sizeof g_reloc[0])) die("too many relocated module globals");
    g_reloc[g_nreloc++] = (reloc_t){rec, live, n};
}
/*@end*/

/*@section modules*/
RT void *load_image(const char *name, size_t n) {
    return load_data(name, n, 1);     /* NUL-terminated: PTX images are text */
}
/*@end*/

/*@section launch_ex*/
RT void launch_ex(int kid, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shm, CUstream s, const unsigned char *attrs, unsigned nattrs,
                      const unsigned char *p, size_t n, int timed) {
    CUlaunchAttribute at[16];
    CUlaunchConfig c;
    size_t size = n;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params_live(p, n), CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    _Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
    memset(&c, 0, sizeof c);
    c.gridDimX = gx; c.gridDimY = gy; c.gridDimZ = gz;
    c.blockDimX = bx; c.blockDimY = by; c.blockDimZ = bz;
    c.sharedMemBytes = shm;
    c.hStream = s;
    memcpy(at, attrs, (size_t)nattrs * sizeof at[0]);
    c.attrs = nattrs ? at : NULL;
    c.numAttrs = nattrs;
    int t = timing_begin(kid, s, timed);
    CK(cuLaunchKernelEx(&c, f, NULL, n ? extra : NULL));
    launched(t, kid, s, timed);
}
/*@end*/

/*@section launch_coop*/
RT void launch_coop(int kid, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, CUstream s, const unsigned char *p, size_t n,
                        const unsigned *offsets, unsigned nparams, int timed) {
    void *kp[1024];
    unsigned char *live = params_live(p, n);
    for (unsigned i = 0; i < nparams && i < 1024; i++) kp[i] = live + offsets[i];
    int t = timing_begin(kid, s, timed);
    CK(cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, kp));
    launched(t, kid, s, timed);
}
/*@end*/

/*@section find_function*/
/* a function whose lookup was not recorded: by name, in its module first, then anywhere */
RT CUfunction find_function(const char *name, CUmodule *mods, int nmods, CUlibrary *libs, int nlibs, int mod, int lib) {
    CUfunction f = NULL;
    CUkernel k = NULL;
    if (mod >= 0 && mods[mod] && cuModuleGetFunction(&f, mods[mod], name) == CUDA_SUCCESS) return f;
    if (lib >= 0 && libs[lib] && cuLibraryGetKernel(&k, libs[lib], name) == CUDA_SUCCESS) return (CUfunction)k;
    for (int i = 0; i < nlibs; i++)
        if (libs[i] && cuLibraryGetKernel(&k, libs[i], name) == CUDA_SUCCESS) return (CUfunction)k;
    for (int i = 0; i < nmods; i++)
        if (mods[i] && cuModuleGetFunction(&f, mods[i], name) == CUDA_SUCCESS) return f;
    die("call #%ld %s: kernel %s not found in any loaded module or library", g_seq, g_api, name);
    return NULL;
}
/*@end*/

/*@section copy2d*/
/* a 2D copy from its recorded CUDA_MEMCPY2D (128 bytes); host ends get buffers of their own */
RT void copy2d(const unsigned char *desc, const char *src_name, size_t src_n, const char *dst_name,
                   size_t dst_n, CUstream s, int async) {
    CUDA_MEMCPY2D c;
    _Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
    memcpy(&c, desc, sizeof c);
    void *src = NULL, *dst = NULL;
    if (c.srcMemoryType == CU_MEMORYTYPE_HOST) {
        src = load_data(src_name, src_n, 0);
        c.srcHost = src; c.srcXInBytes = 0; c.srcY = 0;
    } else {
        c.srcDevice = TR(c.srcDevice);
    }
    if (c.dstMemoryType == CU_MEMORYTYPE_HOST) {
        dst = calloc(dst_n ? dst_n : 1, 1);
        if (!dst) die("out of host memory");
        c.dstHost = dst; c.dstXInBytes = 0; c.dstY = 0;
    } else {
        c.dstDevice = TR(c.dstDevice);
    }
    if (async) {
        CK(cuMemcpy2DAsync(&c, s));
        if (async == 2) { if (dst) g_d2h_unverified++; return; }
        stream_sync(s);
    } else {
        CK(cuMemcpy2D(&c));
    }
    free(src);
    if (dst) {
        /* compare the copied rows only: the gaps are untouched host memory */
        size_t w = c.WidthInBytes, h = c.Height, pitch = c.dstPitch ? c.dstPitch : w;
        unsigned char *rows = malloc(w * h ? w * h : 1);
        if (!rows) die("out of host memory");
        for (size_t i = 0; i < h; i++) memcpy(rows + i * w, (unsigned char *)dst + i * pitch, w);
        if (dst_name) verify(rows, dst_name, w * h);
        else g_d2h_unverified++;
        free(rows);
        free(dst);
    }
}
/*@end*/
