/* The runtime of a program `cudasnap export --sim` writes: the recorded calls on GPGPU-Sim through
   adapter.c, with no Python and no cudasnap. Allocations get the simulator's addresses; recorded
   addresses are translated wherever the export proved them to be pointers (parameters, words of
   uploads, words of expected results). Exit: 0 every D2H result verified, 1 one differs, 2 cannot
   proceed. Run it in a directory holding the model's gpgpusim.config (make run does); the
   simulator logs on stdout, the verdict goes to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"

typedef unsigned long long u64;
static long g_seq = -1;
static const char *g_api = "";
static u64 g_ok, g_bad, g_bytes;
#define AT(s, api) (g_seq = (s), g_api = (api))

static void die(const char *msg) {
    fprintf(stderr, "replay: call #%ld %s: %s\n", g_seq, g_api, msg);
    exit(2);
}
#define CK(x) do { if ((x) != 0) die("the simulator returned an error"); } while (0)

typedef struct { u64 rec, n, live; } alloc_t;
static alloc_t *g_al;
static size_t g_nal, g_cap;

static u64 tr(u64 a) {
    for (size_t i = g_nal; i-- > 0;)
        if (a >= g_al[i].rec && a < g_al[i].rec + (g_al[i].n ? g_al[i].n : 1)) return g_al[i].live + (a - g_al[i].rec);
    die("an address outside every recorded allocation");
    return 0;
}

static void alloc(u64 rec, u64 n) {
    if (g_nal == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_al = realloc(g_al, g_cap * sizeof *g_al);
        if (!g_al) die("out of host memory");
    }
    u64 live;
    CK(sim_malloc(&live, n));
    g_al[g_nal++] = (alloc_t){rec, n, live};
}

/* A module global: recorded at rec, in the simulator where the PTX loader put it (the idx-th of
   the n addresses adapter.c's sim_globals gives). */
static void global_at(u64 rec, int idx, int n, u64 size) {
    static u64 *addr;
    if (!addr) {
        addr = malloc(8 * (size_t)n);
        if (!addr) die("out of host memory");
        CK(sim_globals(addr, n));
    }
    if (g_nal == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_al = realloc(g_al, g_cap * sizeof *g_al);
        if (!g_al) die("out of host memory");
    }
    g_al[g_nal++] = (alloc_t){rec, size, addr[idx]};
}

static void release(u64 rec) {
    for (size_t i = g_nal; i-- > 0;)
        if (g_al[i].rec == rec) {
            memmove(&g_al[i], &g_al[i + 1], (g_nal - i - 1) * sizeof *g_al);
            g_nal--;
            return;                  /* the simulator never reuses an address: nothing to give back */
        }
}

static unsigned char *load(const char *name, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "data/%s", name);
    FILE *f = fopen(path, "rb");
    unsigned char *b = malloc(n ? n : 1);
    if (!f || !b || fread(b, 1, n, f) != n) die("a data file is missing or short (run from the export's directory)");
    fclose(f);
    return b;
}

/* ptrs: offsets of the 8-byte words the export proved to be pointers into recorded allocations */
static void fix(unsigned char *b, const unsigned *ptrs, int np) {
    for (int i = 0; i < np; i++) {
        u64 v;
        memcpy(&v, b + ptrs[i], 8);
        v = tr(v);
        memcpy(b + ptrs[i], &v, 8);
    }
}

static void h2d(u64 dst, const char *file, size_t n, const unsigned *ptrs, int np) {
    unsigned char *b = load(file, n);
    fix(b, ptrs, np);
    CK(sim_h2d(tr(dst), b, n));
    free(b);
}

static void d2h(u64 src, const char *file, size_t n, const unsigned *ptrs, int np) {
    unsigned char *want = load(file, n), *got = malloc(n ? n : 1);
    if (!got) die("out of host memory");
    fix(want, ptrs, np);
    CK(sim_sync());
    CK(sim_d2h(got, tr(src), n));
    size_t i = 0;
    while (i < n && want[i] == got[i]) i++;
    if (i < n) {
        size_t k = 0;
        for (size_t j = i; j < n; j++) k += want[j] != got[j];
        fprintf(stderr, "MISMATCH: call #%ld %s: first divergence at byte offset %zu (recorded device 0x%llx): expected "
               "%02x got %02x; %zu bytes differ of %zu\n", g_seq, g_api, i, src + i, want[i], got[i], k, n);
        g_bad++;
    } else {
        g_ok++;
        g_bytes += n;
    }
    free(want);
    free(got);
}

static void memset_n(u64 dst, unsigned v, int width, size_t count) {
    if (width == 1) {
        CK(sim_memset8(tr(dst), (int)(v & 0xff), count));
        return;
    }
    unsigned char *b = malloc(count * width ? count * width : 1);
    if (!b) die("out of host memory");
    for (size_t i = 0; i < count; i++) memcpy(b + i * width, &v, width);
    CK(sim_h2d(tr(dst), b, count * width));
    free(b);
}

static void launch(void **fn, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shm, const unsigned char *p, size_t n, const unsigned *offs, int nparams,
                   const unsigned *ptrs, int np) {
    unsigned char buf[4096];
    if (n > sizeof buf) die("parameters larger than 4 KiB");
    memcpy(buf, p, n);
    fix(buf, ptrs, np);
    if (!*fn) *fn = sim_register(name);
    CK(sim_launch(*fn, gx, gy, gz, bx, by, bz, shm, buf, nparams, offs));
}

static int finish(void) {
    fprintf(stderr, "%s: %llu device-to-host results verified (%llu bytes), %llu differ\n",
           g_bad ? "FAILED" : "OK", g_ok, g_bytes, g_bad);
    return g_bad ? 1 : 0;
}
