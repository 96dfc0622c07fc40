/*
 * double_launch.c -- modules, libraries, built-in kernels and launches of the
 * cudasnap CUDA driver TEST DOUBLE (see libcuda_double.c).  Never shipped.
 *
 * Module image format of the double (for cuModuleLoadData/Ex, cuModuleLoad,
 * cuLibraryLoadData, cuLibraryLoadFromFile): NUL-terminated text
 *     "CUDADOUBLE\nkernel add_one\nkernel fill\n..."
 * naming built-in host "kernels".  Lines starting with '#' and blank lines are
 * ignored; an unknown kernel name or a missing magic line is CUDA_ERROR_INVALID_IMAGE.
 * A fatbin of such images loads its sm_90 SASS entry's image, else a PTX entry's.
 * Module globals: "global NAME BYTES" lines of such an image, and a PTX module's `.global` /
 * `.const` variables (a scalar initializer `= 0fHEX` or `= INT` copied in), each in device
 * memory of its own (cuModuleGetGlobal); kernels find them by name, the latest load's first.
 *
 * Kernels run synchronously at launch over gridDim*blockDim "threads"
 * (thread i handles element i); device pointers are host addresses and are
 * checked against the allocation table (bad ones: CUDA_ERROR_ILLEGAL_ADDRESS).
 */
#define _GNU_SOURCE
#include "double_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) return r_; } while (0)
#define MAXK 16
#define MAXPARAMS 256

typedef unsigned long long u64;
typedef CUresult (*kfn_t)(const unsigned char *pb, u64 nthreads);
typedef struct kdesc { const char *name; int nparams; size_t off[4], size[4]; size_t total; kfn_t fn; } kdesc_t;

#define P(type, off) (*(type *)(uintptr_t)(pb + (off)))
static u64 count_of(int n, u64 nthreads) { return n <= 0 ? 0 : ((u64)n < nthreads ? (u64)n : nthreads); }

/* add_one(float* p, int n): p[i] += 1 */
static CUresult k_add_one(const unsigned char *pb, u64 nt) {
    float *p = P(float *, 0);
    u64 c = count_of(P(int, 8), nt);
    if (c && !dev_range_ok((u64)(uintptr_t)p, c * sizeof(float))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) p[i] += 1.0f;
    return CUDA_SUCCESS;
}

/* fill(unsigned* p, unsigned v, int n): p[i] = v */
static CUresult k_fill(const unsigned char *pb, u64 nt) {
    unsigned *p = P(unsigned *, 0);
    unsigned v = P(unsigned, 8);
    u64 c = count_of(P(int, 12), nt);
    if (c && !dev_range_ok((u64)(uintptr_t)p, c * sizeof(unsigned))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) p[i] = v;
    return CUDA_SUCCESS;
}

/* saxpy(float a, float* x, float* y, int n): y[i] = a*x[i] + y[i] */
static CUresult k_saxpy(const unsigned char *pb, u64 nt) {
    float a = P(float, 0);
    const float *x = P(float *, 8);
    float *y = P(float *, 16);
    u64 c = count_of(P(int, 24), nt);
    if (c && (!dev_range_ok((u64)(uintptr_t)x, c * 4) || !dev_range_ok((u64)(uintptr_t)y, c * 4)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) y[i] = a * x[i] + y[i];
    return CUDA_SUCCESS;
}

/* chase(u64* table, u64* out, int n): out[i] = *(u64*)table[i] -- reads through stored device pointers */
static CUresult k_chase(const unsigned char *pb, u64 nt) {
    const u64 *table = P(u64 *, 0);
    u64 *out = P(u64 *, 8);
    u64 c = count_of(P(int, 16), nt);
    if (c && (!dev_range_ok((u64)(uintptr_t)table, c * 8) || !dev_range_ok((u64)(uintptr_t)out, c * 8)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) {
        if (!dev_range_ok(table[i], 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
        out[i] = *(const u64 *)(uintptr_t)table[i];
    }
    return CUDA_SUCCESS;
}

/* tagged_read(u64 tagged, u64* out, int n): out[i] = p[i] with p = tagged ^ TAG_KEY -- a pointer the
 * parameters hide (an encoded handle): neither parameter scanning nor pointer scanning finds it */
#define TAG_KEY 0x5a5a000000000000ULL
static CUresult k_tagged_read(const unsigned char *pb, u64 nt) {
    const u64 *p = (const u64 *)(uintptr_t)(P(u64, 0) ^ TAG_KEY);
    u64 *out = P(u64 *, 8);
    u64 c = count_of(P(int, 16), nt);
    if (c && (!dev_range_ok((u64)(uintptr_t)p, c * 8) || !dev_range_ok((u64)(uintptr_t)out, c * 8)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) out[i] = p[i];
    return CUDA_SUCCESS;
}

/* incr(int* p, int n): p[i]++ */
static CUresult k_incr(const unsigned char *pb, u64 nt) {
    int *p = P(int *, 0);
    u64 c = count_of(P(int, 8), nt);
    if (c && !dev_range_ok((u64)(uintptr_t)p, c * sizeof(int))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) p[i]++;
    return CUDA_SUCCESS;
}

/* spin(int ms): sleeps */
static CUresult k_spin(const unsigned char *pb, u64 nt) {
    (void)nt;
    int ms = P(int, 0);
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
    return CUDA_SUCCESS;
}

/* tex_fetch(u64 tex, float* out, int n): out[i] = the texture's float element i */
static CUresult k_tex_fetch(const unsigned char *pb, u64 nt) {
    size_t bytes = 0;
    const float *t = (const float *)texture_bytes(P(u64, 0), 0, &bytes);
    float *out = P(float *, 8);
    u64 c = count_of(P(int, 16), nt);
    if (!t || c * sizeof(float) > bytes) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (c && !dev_range_ok((u64)(uintptr_t)out, c * sizeof(float))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) out[i] = t[i];
    return CUDA_SUCCESS;
}

/* surf_fill(u64 surf, float v, int n): the surface's float elements 0..n-1 = v */
static CUresult k_surf_fill(const unsigned char *pb, u64 nt) {
    size_t bytes = 0;
    float *s = (float *)texture_bytes(P(u64, 0), 1, &bytes);
    float v = P(float, 8);
    u64 c = count_of(P(int, 12), nt);
    if (!s || c * sizeof(float) > bytes) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) s[i] = v;
    return CUDA_SUCCESS;
}

/* tile_sum(const int* in, int* out, int n): out[b] = sum of in[256 b .. 256 b + 255] (blocks of 256
 * threads; shared memory and barriers in its PTX) */
static CUresult k_tile_sum(const unsigned char *pb, u64 nt) {
    const int *in = P(const int *, 0);
    int *out = P(int *, 8);
    u64 c = count_of(P(int, 16), nt), blocks = (c + 255) / 256;
    if (c && (!dev_range_ok((u64)(uintptr_t)in, c * 4) || !dev_range_ok((u64)(uintptr_t)out, blocks * 4)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 b = 0; b < blocks; b++) {
        int sum = 0;
        for (u64 i = b * 256; i < c && i < b * 256 + 256; i++) sum += in[i];
        out[b] = sum;
    }
    return CUDA_SUCCESS;
}

/* histo(const unsigned* in, unsigned* bins, int n, int nbins): bins[in[i] % nbins] += 1 (atomics in its PTX) */
static CUresult k_histo(const unsigned char *pb, u64 nt) {
    const unsigned *in = P(const unsigned *, 0);
    unsigned *bins = P(unsigned *, 8);
    u64 c = count_of(P(int, 16), nt);
    int nb = P(int, 20);
    if (nb <= 0) return CUDA_SUCCESS;
    if (c && (!dev_range_ok((u64)(uintptr_t)in, c * 4) || !dev_range_ok((u64)(uintptr_t)bins, (u64)nb * 4)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) bins[in[i] % (unsigned)nb]++;
    return CUDA_SUCCESS;
}

/* Module globals by name, latest first (module_from_image, module_free). */
#define MAXG 64
struct gvar { char name[64]; CUdeviceptr p; size_t n; const void *mod; };
static struct gvar gtab[MAXG];
static int ngtab;

static const struct gvar *global_named(const char *name) {
    for (int i = ngtab; i-- > 0;)
        if (strcmp(gtab[i].name, name) == 0) return &gtab[i];
    return NULL;
}

/* glob_axpb(float* p, int n): p[i] = fma(p[i], g_scale, c_bias[i % 4]), g_scale a __device__
 * float and c_bias a __constant__ float[4] of its module */
static CUresult k_glob_axpb(const unsigned char *pb, u64 nt) {
    float *p = P(float *, 0);
    u64 c = count_of(P(int, 8), nt);
    const struct gvar *s = global_named("g_scale"), *b = global_named("c_bias");
    if (!s || !b || s->n < 4 || b->n < 16) return CUDA_ERROR_NOT_FOUND;
    if (c && !dev_range_ok((u64)(uintptr_t)p, c * sizeof(float))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    float scale = *(const float *)(uintptr_t)s->p;
    const float *bias = (const float *)(uintptr_t)b->p;
    for (u64 i = 0; i < c; i++) p[i] = fmaf(p[i], scale, bias[i & 3]);
    return CUDA_SUCCESS;
}

/* fast_sin(float* p, int n): p[i] = sin(p[i]) (PTX: sin.approx.f32, __sinf) */
static CUresult k_fast_sin(const unsigned char *pb, u64 nt) {
    float *p = P(float *, 0);
    u64 c = count_of(P(int, 8), nt);
    if (c && !dev_range_ok((u64)(uintptr_t)p, c * sizeof(float))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    for (u64 i = 0; i < c; i++) p[i] = sinf(p[i]);
    return CUDA_SUCCESS;
}

static const kdesc_t kernels[] = {
    {"tile_sum", 3, {0, 8, 16}, {8, 8, 4}, 20, k_tile_sum},
    {"histo", 4, {0, 8, 16, 20}, {8, 8, 4, 4}, 24, k_histo},
    {"add_one", 2, {0, 8}, {8, 4}, 12, k_add_one},
    {"fill", 3, {0, 8, 12}, {8, 4, 4}, 16, k_fill},
    {"saxpy", 4, {0, 8, 16, 24}, {4, 8, 8, 4}, 28, k_saxpy},
    {"chase", 3, {0, 8, 16}, {8, 8, 4}, 20, k_chase},
    {"tagged_read", 3, {0, 8, 16}, {8, 8, 4}, 20, k_tagged_read},
    {"incr", 2, {0, 8}, {8, 4}, 12, k_incr},
    {"spin", 1, {0}, {4}, 4, k_spin},
    {"tex_fetch", 3, {0, 8, 16}, {8, 8, 4}, 20, k_tex_fetch},
    {"surf_fill", 3, {0, 8, 12}, {8, 4, 4}, 16, k_surf_fill},
    {"glob_axpb", 2, {0, 8}, {8, 4}, 12, k_glob_axpb},
    {"fast_sin", 2, {0, 8}, {8, 4}, 12, k_fast_sin},
    /* incr under C++ names, for kernel-name matching: incr(int*, int), void demo::incr<int>(int*, int) */
    {"_Z4incrPii", 2, {0, 8}, {8, 4}, 12, k_incr},
    {"_ZN4demo4incrIiEEvPT_i", 2, {0, 8}, {8, 4}, 12, k_incr},
    /* add_one under an NCCL kernel's name: collectives matched across the ranks of a job */
    {"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2, {0, 8}, {8, 4}, 12, k_add_one},
};
#define NKERNELS (sizeof kernels / sizeof kernels[0])

/* ------------------------------------------------------------------ objects */
struct mod_obj;
/* lazy: DOUBLE_LAZY_FUNCTIONS=1 creates functions unloaded, as CUDA_MODULE_LOADING=LAZY does:
 * no name until a launch or cuFuncLoad loads them */
struct func_obj { int type; const kdesc_t *k; struct mod_obj *mod; int attrs[CU_FUNC_ATTRIBUTE_MAX]; int lazy; };
struct kern_obj { int type; struct func_obj *func; };
struct mod_obj { int type; int nk; struct func_obj *funcs[MAXK]; int owned_by_library; int ng; struct gvar g[MAXK]; };

/* One global of a module being made: its memory, its initializer's bytes (init, or none). */
static CUresult add_global(struct mod_obj *m, const char *name, size_t nlen, size_t bytes, const void *init, size_t ilen) {
    if (m->ng >= MAXK || nlen == 0 || nlen >= sizeof m->g[0].name || bytes == 0 || ngtab >= MAXG) return CUDA_ERROR_INVALID_IMAGE;
    struct gvar *g = &m->g[m->ng];
    memcpy(g->name, name, nlen);
    g->name[nlen] = 0;
    g->n = bytes;
    g->mod = m;
    CHECK(dbl_mem_alloc(&g->p, bytes));
    memset((void *)(uintptr_t)g->p, 0, bytes);
    if (init) memcpy((void *)(uintptr_t)g->p, init, ilen < bytes ? ilen : bytes);
    gtab[ngtab++] = *g;
    m->ng++;
    return CUDA_SUCCESS;
}

/* The module-scope `.global` / `.const` variables of PTX text (outside every function body). */
static CUresult ptx_globals(struct mod_obj *m, const char *img, size_t len) {
    int depth = 0;
    for (const char *p = img, *end = img + len; p < end; ) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *q = p;
        int at = depth;
        for (const char *c = p; c < le; c++) depth += *c == '{' ? 1 : *c == '}' ? -1 : 0;
        p = le + 1;
        while (q < le && (*q == ' ' || *q == '\t')) q++;
        if (at > 0) continue;
        if (strncmp(q, ".visible ", 9) == 0) q += 9;
        if (strncmp(q, ".global ", 8) != 0 && strncmp(q, ".const ", 7) != 0) continue;
        char type[16] = "", name[64] = "";
        unsigned long count = 1, align = 0;
        int k = 0;
        q = strchr(q, ' ') + 1;
        if (sscanf(q, ".align %lu %n", &align, &k) == 1) q += k;
        if (sscanf(q, ".%15s %63[A-Za-z0-9_$]%n", type, name, &k) != 2) return CUDA_ERROR_INVALID_IMAGE;
        q += k;
        if (*q == '[' && sscanf(q, "[%lu]", &count) != 1) return CUDA_ERROR_INVALID_IMAGE;
        size_t esz = strchr("uisbf", type[0]) && atoi(type + 1) >= 8 ? (size_t)atoi(type + 1) / 8 : 0;
        if (!esz) return CUDA_ERROR_INVALID_IMAGE;
        const char *eq = memchr(q, '=', (size_t)(le - q));
        unsigned long long v = 0;
        int has = eq && (sscanf(eq, "= 0f%llx", &v) == 1 || sscanf(eq, "= %llu", &v) == 1);
        CHECK(add_global(m, name, strlen(name), esz * count, has ? &v : NULL, esz));
    }
    return CUDA_SUCCESS;
}

/* "global NAME BYTES" lines of a double image. */
static CUresult image_globals(struct mod_obj *m, const char *img, size_t len) {
    for (const char *p = img, *end = img + len; p < end; ) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        char name[64];
        unsigned long n;
        if (le - p > 7 && strncmp(p, "global ", 7) == 0 && sscanf(p + 7, "%63s %lu", name, &n) == 2)
            CHECK(add_global(m, name, strlen(name), n, NULL, 0));
        p = le + 1;
    }
    return CUDA_SUCCESS;
}
struct lib_obj { int type; struct mod_obj *mod; struct kern_obj *kerns[MAXK]; };

/* A PTX module (text with `.entry NAME(`): each entry runs the host kernel of the same name. */
static CUresult parse_ptx(const char *img, size_t len, const kdesc_t **found, int *nfound) {
    *nfound = 0;
    for (const char *p = img; (p = strstr(p, ".entry")) != NULL && p < img + len; ) {
        p += 6;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, "( \t\r\n");
        const kdesc_t *k = NULL;
        for (size_t i = 0; i < NKERNELS; i++)
            if (strlen(kernels[i].name) == n && strncmp(kernels[i].name, p, n) == 0) k = &kernels[i];
        if (!k || *nfound >= MAXK) return CUDA_ERROR_INVALID_IMAGE;
        found[(*nfound)++] = k;
    }
    return *nfound ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
}

static CUresult parse_image(const char *img, size_t maxlen, const kdesc_t **found, int *nfound) {
    static const char magic[] = "CUDADOUBLE";
    if (!img) return CUDA_ERROR_INVALID_VALUE;
    size_t len = strnlen(img, maxlen);
    if (memcmp(img, magic, len < sizeof magic - 1 ? len : sizeof magic - 1) != 0 && strstr(img, ".entry"))
        return parse_ptx(img, len, found, nfound);
    if (len < sizeof magic - 1 || memcmp(img, magic, sizeof magic - 1) != 0) return CUDA_ERROR_INVALID_IMAGE;
    *nfound = 0;
    const char *p = img + sizeof magic - 1, *end = img + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        char line[128];
        size_t ll = (size_t)(le - p);
        while (ll && (p[ll - 1] == '\r' || p[ll - 1] == ' ' || p[ll - 1] == '\t')) ll--;
        if (ll >= sizeof line) return CUDA_ERROR_INVALID_IMAGE;
        memcpy(line, p, ll);
        line[ll] = 0;
        p = le + 1;
        if (!ll || line[0] == '#') continue;
        if (strncmp(line, "kernel ", 7) != 0) continue;
        const char *name = line + 7;
        while (*name == ' ') name++;
        const kdesc_t *k = NULL;
        for (size_t i = 0; i < NKERNELS; i++)
            if (strcmp(kernels[i].name, name) == 0) k = &kernels[i];
        if (!k) return CUDA_ERROR_INVALID_IMAGE;
        int dup = 0;
        for (int i = 0; i < *nfound; i++) dup |= found[i] == k;
        if (!dup) {
            if (*nfound >= MAXK) return CUDA_ERROR_INVALID_IMAGE;
            found[(*nfound)++] = k;
        }
    }
    return CUDA_SUCCESS;
}

/* A fatbin whose entries hold double images (for tools that read or rewrite fatbins): the
 * image of its sm_90 SASS entry (the double's architecture), else of a PTX entry; NULL when it
 * has neither. Any other image is itself. */
static const char *fatbin_entry(const void *image, size_t *maxlen) {
    const unsigned char *p = image;
    u64 hsize, fsize;
    if (*maxlen < 16 || *(const unsigned *)p != 0xBA55ED50u) return image;
    hsize = *(const unsigned short *)(p + 6);
    fsize = *(const u64 *)(p + 8);
    for (int want = 2; want >= 1; want--) {
        const unsigned char *e = p + hsize, *end = p + hsize + fsize;
        while (e + 64 <= end) {
            unsigned kind = *(const unsigned short *)e, ehsize = *(const unsigned *)(e + 4);
            u64 psize = *(const u64 *)(e + 8);
            if (ehsize < 64) break;
            if (kind == (unsigned)want && (want == 1 || *(const unsigned *)(e + 28) == 90)) {
                *maxlen = psize;
                return (const char *)e + ehsize;
            }
            e += ehsize + psize;
        }
    }
    return NULL;
}

/* A cubin (ELF64) whose section holds a double image, as a JIT compiler's cubin would hold
 * SASS: that section's text; NULL when none does. Any other image is itself. */
static const char *elf_entry(const void *image, size_t *maxlen) {
    const unsigned char *p = image;
    if (*maxlen < 64 || memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return image;
    u64 shoff = *(const u64 *)(p + 0x28);
    unsigned shentsize = *(const unsigned short *)(p + 0x3A), shnum = *(const unsigned short *)(p + 0x3C);
    for (unsigned i = 0; i < shnum && shoff && shentsize >= 64; i++) {
        const unsigned char *sh = p + shoff + (u64)i * shentsize;
        u64 off = *(const u64 *)(sh + 0x18), size = *(const u64 *)(sh + 0x20);
        if (*(const unsigned *)(sh + 4) == 1 && size >= 10 && memcmp(p + off, "CUDADOUBLE", 10) == 0) {
            *maxlen = size;
            return (const char *)p + off;
        }
    }
    return NULL;
}

static void module_free(struct mod_obj *m) {
    for (int i = 0; i < m->nk; i++) obj_free(m->funcs[i]);
    for (int i = 0; i < m->ng; i++) dbl_mem_free(m->g[i].p);
    int k = 0;
    for (int i = 0; i < ngtab; i++)
        if (gtab[i].mod != m) gtab[k++] = gtab[i];
    ngtab = k;
    obj_free(m);
}

static CUresult module_from_image(struct mod_obj **out, const void *image, size_t maxlen) {
    const kdesc_t *found[MAXK];
    int n = 0;
    if (image && !(image = fatbin_entry(image, &maxlen))) return CUDA_ERROR_INVALID_IMAGE;
    if (image && !(image = elf_entry(image, &maxlen))) return CUDA_ERROR_INVALID_IMAGE;
    CHECK(parse_image(image, maxlen, found, &n));
    struct mod_obj *m = obj_new(OBJ_MODULE, sizeof *m);
    m->nk = n;
    for (int i = 0; i < n; i++) {
        struct func_obj *f = obj_new(OBJ_FUNC, sizeof *f);
        f->k = found[i];
        f->mod = m;
        f->lazy = getenv("DOUBLE_LAZY_FUNCTIONS") && atoi(getenv("DOUBLE_LAZY_FUNCTIONS"));
        f->attrs[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = 1024;
        f->attrs[CU_FUNC_ATTRIBUTE_NUM_REGS] = 16;
        f->attrs[CU_FUNC_ATTRIBUTE_PTX_VERSION] = 90;
        f->attrs[CU_FUNC_ATTRIBUTE_BINARY_VERSION] = 90;
        f->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES] = 49152;
        f->attrs[CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
        m->funcs[i] = f;
    }
    size_t len = strnlen(image, maxlen);
    CUresult r = memcmp(image, "CUDADOUBLE", len < 10 ? len : 10) == 0 ? image_globals(m, image, len)
                                                                      : ptx_globals(m, image, len);
    if (r != CUDA_SUCCESS) {
        module_free(m);
        return r;
    }
    *out = m;
    return CUDA_SUCCESS;
}

static char *read_file(const char *fname) {
    FILE *f = fopen(fname, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}


API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    CHECK(need_ctx());
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    return module_from_image((struct mod_obj **)module, image, 1 << 20);
}

API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                                void **optionValues) {
    if (numOptions && (!options || !optionValues)) return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, image);
}

API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    CHECK(need_ctx());
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    char *buf = read_file(fname);
    if (!buf) return CUDA_ERROR_FILE_NOT_FOUND;
    CUresult r = module_from_image((struct mod_obj **)module, buf, 1 << 20);
    free(buf);
    return r;
}

API CUresult cuModuleUnload(CUmodule hmod) {
    CHECK(need_init());
    struct mod_obj *m = (struct mod_obj *)hmod;
    if (!obj_check(m, OBJ_MODULE) || m->owned_by_library) return CUDA_ERROR_INVALID_HANDLE;
    module_free(m);
    return CUDA_SUCCESS;
}

static CUresult module_get_function(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CHECK(need_ctx());
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    struct mod_obj *m = (struct mod_obj *)hmod;
    if (!obj_check(m, OBJ_MODULE)) return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < m->nk; i++)
        if (strcmp(m->funcs[i]->k->name, name) == 0) { *hfunc = (CUfunction)m->funcs[i]; return CUDA_SUCCESS; }
    return CUDA_ERROR_NOT_FOUND;
}

API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    return module_get_function(hfunc, hmod, name);
}

API CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name) {
    CHECK(need_ctx());
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(hmod, OBJ_MODULE)) return CUDA_ERROR_INVALID_HANDLE;
    struct mod_obj *m = (struct mod_obj *)hmod;
    for (int i = 0; i < m->ng; i++)
        if (strcmp(m->g[i].name, name) == 0) {
            if (dptr) *dptr = m->g[i].p;
            if (bytes) *bytes = m->g[i].n;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

static CUresult library_from_image(CUlibrary *library, const void *code) {
    CHECK(need_init());
    if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
    struct mod_obj *m;
    CHECK(module_from_image(&m, code, 1 << 20));
    m->owned_by_library = 1;
    struct lib_obj *l = obj_new(OBJ_LIBRARY, sizeof *l);
    l->mod = m;
    for (int i = 0; i < m->nk; i++) {
        l->kerns[i] = obj_new(OBJ_KERNEL, sizeof(struct kern_obj));
        l->kerns[i]->func = m->funcs[i];
    }
    *library = (CUlibrary)l;
    return CUDA_SUCCESS;
}

API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jo, void **jv, unsigned int nj,
                               CUlibraryOption *lo, void **lv, unsigned int nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return library_from_image(library, code);
}

API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jo, void **jv,
                                   unsigned int nj, CUlibraryOption *lo, void **lv, unsigned int nl) {
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    CHECK(need_init());
    if (!fileName) return CUDA_ERROR_INVALID_VALUE;
    char *buf = read_file(fileName);
    if (!buf) return CUDA_ERROR_FILE_NOT_FOUND;
    CUresult r = library_from_image(library, buf);
    free(buf);
    return r;
}

API CUresult cuLibraryUnload(CUlibrary library) {
    CHECK(need_init());
    struct lib_obj *l = (struct lib_obj *)library;
    if (!obj_check(l, OBJ_LIBRARY)) return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < l->mod->nk; i++) obj_free(l->kerns[i]);
    module_free(l->mod);
    obj_free(l);
    return CUDA_SUCCESS;
}

API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    CHECK(need_init());
    struct lib_obj *l = (struct lib_obj *)library;
    if (!pKernel || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(l, OBJ_LIBRARY)) return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < l->mod->nk; i++)
        if (strcmp(l->mod->funcs[i]->k->name, name) == 0) { *pKernel = (CUkernel)l->kerns[i]; return CUDA_SUCCESS; }
    return CUDA_ERROR_NOT_FOUND;
}

API CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library) {
    CHECK(need_ctx());
    if (!pMod) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(library, OBJ_LIBRARY)) return CUDA_ERROR_INVALID_HANDLE;
    *pMod = (CUmodule)((struct lib_obj *)library)->mod;
    return CUDA_SUCCESS;
}

API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    CHECK(need_ctx());
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    if (!obj_check(kernel, OBJ_KERNEL)) return CUDA_ERROR_INVALID_HANDLE;
    *pFunc = (CUfunction)((struct kern_obj *)kernel)->func;
    return CUDA_SUCCESS;
}

/* A CUfunction or a CUkernel used in its place (allowed since CUDA 12.0). */
static struct func_obj *as_func(const void *h) {
    if (obj_check(h, OBJ_FUNC)) return (struct func_obj *)h;
    if (obj_check(h, OBJ_KERNEL)) return ((const struct kern_obj *)h)->func;
    return NULL;
}

static CUresult param_info(const void *h, size_t idx, size_t *off, size_t *size) {
    CHECK(need_init());
    struct func_obj *f = as_func(h);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (idx >= (size_t)f->k->nparams) return CUDA_ERROR_INVALID_VALUE;
    if (off) *off = f->k->off[idx];
    if (size) *size = f->k->size[idx];
    return CUDA_SUCCESS;
}

API CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) { return param_info(f, i, off, size); }

API CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size) {
    if (!obj_check(k, OBJ_KERNEL)) return CUDA_ERROR_INVALID_HANDLE;
    return param_info(k, i, off, size);
}

API CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (f->lazy) return CUDA_ERROR_NOT_FOUND;
    *name = f->k->name;
    return CUDA_SUCCESS;
}

API CUresult cuFuncIsLoaded(int *state, CUfunction hfunc) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!state) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    *state = f->lazy ? 0 : 1;        /* CU_FUNCTION_LOADING_STATE_UNLOADED / _LOADED */
    return CUDA_SUCCESS;
}

/* DOUBLE_LOAD_AFTER_LAUNCH_FAILS=1: loading a function once this process has launched fails, as
 * a load waits forever on a GPU where a collective of the job waits for its peer */
static int launched_any;
static int load_blocked(void) {
    const char *e = getenv("DOUBLE_LOAD_AFTER_LAUNCH_FAILS");
    return launched_any && e && atoi(e);
}

API CUresult cuFuncLoad(CUfunction hfunc) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (f->lazy && load_blocked()) return CUDA_ERROR_LAUNCH_FAILED;
    f->lazy = 0;
    return CUDA_SUCCESS;
}

API CUresult cuKernelGetName(const char **name, CUkernel k) {
    if (!obj_check(k, OBJ_KERNEL)) return CUDA_ERROR_INVALID_HANDLE;
    return cuFuncGetName(name, (CUfunction)k);
}

API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!pi || (unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    *pi = f->attrs[attrib];
    return CUDA_SUCCESS;
}

API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES && attrib != CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT &&
        (unsigned)attrib < 10)
        return CUDA_ERROR_INVALID_VALUE; /* read-only attributes */
    if ((unsigned)attrib >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    f->attrs[attrib] = value;
    return CUDA_SUCCESS;
}

API CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel k, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!obj_check(k, OBJ_KERNEL)) return CUDA_ERROR_INVALID_HANDLE;
    return cuFuncGetAttribute(pi, attrib, (CUfunction)k);
}

API CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel k, CUdevice dev) {
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!obj_check(k, OBJ_KERNEL)) return CUDA_ERROR_INVALID_HANDLE;
    return cuFuncSetAttribute((CUfunction)k, attrib, val);
}

API CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
    CHECK(need_init());
    if ((unsigned)config > 3) return CUDA_ERROR_INVALID_VALUE;
    return as_func(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc) {
    CHECK(need_init());
    struct func_obj *f = as_func(hfunc);
    if (!hmod) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    *hmod = (CUmodule)f->mod;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ launches */
/* CUDA_DOUBLE_SLOW="NAME:FACTOR[,NAME:FACTOR...]" (NAME * = every kernel): a matching kernel
 * runs for FACTOR x max(its own run time, CUDA_DOUBLE_SLOW_FLOOR_US, default 500 us),
 * waiting after its work, so CUDA events around it (host clock) show the factor.
 * FACTOR 1 only gives the kernel the floor: a steady time to compare against.  An entry
 * naming the kernel wins over '*'.
 *
 * CUDA_DOUBLE_CLOCK=virtual: events read a device clock of the double's own instead of the
 * host's.  A slowed kernel advances it by exactly FACTOR x the floor, times 1 + a planted
 * noise (CUDA_DOUBLE_JITTER percent, default 2, uniform, seeded by CUDA_DOUBLE_SEED and the
 * launch's number in the process), and does not wait; any other kernel advances it by 1 us.
 * Timings are then the same on an idle and on a loaded machine: the tests whose verdict is
 * about times use it. */
#define MAXSLOW 16
static struct { char name[64]; double factor; } slow[MAXSLOW];
static int nslow;
static double slow_floor_ns = 500e3;
static pthread_once_t slow_once = PTHREAD_ONCE_INIT;

/* CUDA_DOUBLE_SLOW_VISIBLE="IDS:FACTOR": where CUDA_VISIBLE_DEVICES is IDS, the slowed kernels'
 * factors are multiplied by FACTOR: one GPU of a machine slower than the others. */
static double device_factor = 1.0;

static int virtual_clock;
static double wall_ns;          /* CUDA_DOUBLE_WALL_US: host time a launch also takes under the virtual clock */
static double jitter = 0.02;
static unsigned long long jitter_seed, launch_no, virtual_ns;

/* splitmix64: a planted noise that depends only on the seed and the launch's number */
static double jitter_of(unsigned long long n) {
    unsigned long long z = jitter_seed + (n + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return ((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * jitter;
}

static void slow_parse(void);

/* the time an event records: the host's monotonic clock, or the virtual device clock */
void dbl_clock_now(struct timespec *t) {
    pthread_once(&slow_once, slow_parse);
    if (!virtual_clock) {
        clock_gettime(CLOCK_MONOTONIC, t);
        return;
    }
    unsigned long long ns = __atomic_load_n(&virtual_ns, __ATOMIC_RELAXED);
    t->tv_sec = (time_t)(ns / 1000000000ULL);
    t->tv_nsec = (long)(ns % 1000000000ULL);
}

static void slow_parse(void) {
    const char *e = getenv("CUDA_DOUBLE_SLOW"), *fl = getenv("CUDA_DOUBLE_SLOW_FLOOR_US");
    const char *dv = getenv("CUDA_DOUBLE_SLOW_VISIBLE"), *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (fl && *fl) slow_floor_ns = strtod(fl, NULL) * 1e3;
    if (dv && vis) {
        const char *colon = strrchr(dv, ':');
        if (colon && strlen(vis) == (size_t)(colon - dv) && strncmp(dv, vis, (size_t)(colon - dv)) == 0 &&
            strtod(colon + 1, NULL) > 0)
            device_factor = strtod(colon + 1, NULL);
    }
    while (e && *e && nslow < MAXSLOW) {
        const char *end = strchr(e, ','), *colon = strchr(e, ':');
        if (!end) end = e + strlen(e);
        if (colon && colon < end && (size_t)(colon - e) < sizeof slow[0].name) {
            memcpy(slow[nslow].name, e, (size_t)(colon - e));
            slow[nslow].name[colon - e] = 0;
            slow[nslow].factor = strtod(colon + 1, NULL);
            if (slow[nslow].factor > 0) nslow++;
        }
        e = *end ? end + 1 : end;
    }
    const char *clk = getenv("CUDA_DOUBLE_CLOCK"), *jit = getenv("CUDA_DOUBLE_JITTER"), *seed = getenv("CUDA_DOUBLE_SEED");
    virtual_clock = clk && strcmp(clk, "virtual") == 0;
    if (jit && *jit) jitter = strtod(jit, NULL) / 100.0;
    if (seed && *seed) jitter_seed = strtoull(seed, NULL, 0);
    const char *wall = getenv("CUDA_DOUBLE_WALL_US");
    if (wall && *wall) wall_ns = strtod(wall, NULL) * 1e3;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static CUresult launch_run_kernel(void *func, const unsigned int grid[3], const unsigned int block[3],
                                  const unsigned char *params, size_t params_len);

/* CUDA_DOUBLE_CORRUPT="NAME:N[@OFF]": the N-th launch (from 1) of kernel NAME in the process,
 * after running, flips bit 6 of the byte at OFF (default 0) its first parameter (a pointer)
 * points to: a wrong result planted in device memory, for the replay checks to catch. */
static char corrupt_name[64];
static long corrupt_at = -1, corrupt_seen, corrupt_off;
static pthread_once_t corrupt_once = PTHREAD_ONCE_INIT;

static void corrupt_parse(void) {
    const char *e = getenv("CUDA_DOUBLE_CORRUPT"), *colon = e ? strrchr(e, ':') : NULL;
    if (!colon || (size_t)(colon - e) >= sizeof corrupt_name) return;
    memcpy(corrupt_name, e, (size_t)(colon - e));
    char *end;
    corrupt_at = strtol(colon + 1, &end, 10);
    if (*end == '@') corrupt_off = strtol(end + 1, NULL, 10);
}

static void corrupt_maybe(const kdesc_t *k, const unsigned char *pb) {
    pthread_once(&corrupt_once, corrupt_parse);
    if (corrupt_at < 1 || strcmp(corrupt_name, k->name) != 0) return;
    if (__atomic_add_fetch(&corrupt_seen, 1, __ATOMIC_RELAXED) != corrupt_at) return;
    unsigned char *p = P(unsigned char *, 0) + corrupt_off;
    if (dev_range_ok((u64)(uintptr_t)p, 1)) p[0] ^= 0x40;
}

/* CUDA_DOUBLE_PERTURB="NAME:ulp:K" or "NAME:add:V": after every launch of kernel NAME, its float
 * output (the last pointer parameter; n: the 4-byte parameter after it) gets +1 in the last place
 * on every K-th element (0, K, 2K, ...), or V added to every element: a rebuilt kernel that
 * rounds otherwise, or one that computes something else. "NAME:jitter": +1 ULP on one element
 * that changes from run to run, as float atomics give. */
static char perturb_name[64];
static int perturb_ulp = 0, perturb_jitter = 0;
static float perturb_add = 0;
static pthread_once_t perturb_once = PTHREAD_ONCE_INIT;

static void perturb_parse(void) {
    const char *e = getenv("CUDA_DOUBLE_PERTURB"), *c1 = e ? strchr(e, ':') : NULL;
    if (!c1 || (size_t)(c1 - e) >= sizeof perturb_name) return;
    memcpy(perturb_name, e, (size_t)(c1 - e));
    if (strncmp(c1 + 1, "ulp:", 4) == 0) perturb_ulp = atoi(c1 + 5);
    else if (strncmp(c1 + 1, "add:", 4) == 0) perturb_add = strtof(c1 + 5, NULL);
    else if (strcmp(c1 + 1, "jitter") == 0) perturb_jitter = 1;
}

static void perturb_maybe(const kdesc_t *k, const unsigned char *pb, u64 nt) {
    pthread_once(&perturb_once, perturb_parse);
    if ((perturb_ulp <= 0 && perturb_add == 0 && !perturb_jitter) || strcmp(perturb_name, k->name) != 0) return;
    int out = -1;
    for (int i = 0; i < k->nparams; i++)
        if (k->size[i] == 8) out = i;
    if (out < 0 || out + 1 >= k->nparams || k->size[out + 1] != 4) return;
    float *p = P(float *, k->off[out]);
    u64 c = count_of(P(int, k->off[out + 1]), nt);
    if (!c || !dev_range_ok((u64)(uintptr_t)p, c * 4)) return;
    if (perturb_jitter) {         /* one element, another each run: float atomics' order */
        u64 i = (u64)now_ns() % c;
        unsigned w;
        memcpy(&w, &p[i], 4); w += 1; memcpy(&p[i], &w, 4);
        return;
    }
    for (u64 i = 0; i < c; i++) {
        if (perturb_add != 0) { p[i] += perturb_add; continue; }
        if (i % (u64)perturb_ulp == 0) { unsigned w; memcpy(&w, &p[i], 4); w += 1; memcpy(&p[i], &w, 4); }
    }
}

CUresult launch_run(void *func, const unsigned int grid[3], const unsigned int block[3], const unsigned char *params,
                    size_t params_len) {
    CUresult r = launch_run_kernel(func, grid, block, params, params_len);
    if (r == CUDA_SUCCESS) {
        unsigned char pb[MAXPARAMS] = {0};
        memcpy(pb, params, params_len < MAXPARAMS ? params_len : MAXPARAMS);
        corrupt_maybe(func, pb);
        perturb_maybe(func, pb, (u64)grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]);
    }
    return r;
}

static CUresult launch_run_kernel(void *func, const unsigned int grid[3], const unsigned int block[3],
                                  const unsigned char *params, size_t params_len) {
    const kdesc_t *k = func;
    __atomic_add_fetch(&dbl_ops, 1, __ATOMIC_RELAXED);
    unsigned char pb[MAXPARAMS] = {0};
    memcpy(pb, params, params_len < MAXPARAMS ? params_len : MAXPARAMS);
    u64 nthreads = (u64)grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2];
    pthread_once(&slow_once, slow_parse);
    double factor = 0, any = 0;
    for (int i = 0; i < nslow; i++) {
        if (!factor && strcmp(slow[i].name, k->name) == 0) factor = slow[i].factor;
        if (!any && strcmp(slow[i].name, "*") == 0) any = slow[i].factor;
    }
    if (!factor) factor = any;
    if (virtual_clock) {
        double ns = factor ? factor * device_factor * slow_floor_ns : 1e3;
        unsigned long long n = __atomic_fetch_add(&launch_no, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&virtual_ns, (unsigned long long)(ns * (1.0 + jitter_of(n))), __ATOMIC_RELAXED);
        if (wall_ns > 0) {      /* work that takes host time (a node busy when it is lost), unmeasured */
            struct timespec ts = {(time_t)(wall_ns / 1e9), (long)(wall_ns - (double)(time_t)(wall_ns / 1e9) * 1e9)};
            nanosleep(&ts, NULL);
        }
        return k->fn(pb, nthreads);
    }
    if (!factor) return k->fn(pb, nthreads);
    factor *= device_factor;
    double t0 = now_ns();
    CUresult r = k->fn(pb, nthreads);
    double took = now_ns() - t0, until = t0 + factor * (took > slow_floor_ns ? took : slow_floor_ns);
    /* sleep to 100 us before the end, then spin: a long spin on a loaded host gets the thread
     * preempted for whole time slices, a sleeper wakes promptly */
    if (until - now_ns() > 150e3) {
        double wake = until - 100e3;
        struct timespec ts = {(time_t)(wake / 1e9), (long)(wake - (double)(time_t)(wake / 1e9) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
    }
    while (now_ns() < until) {}
    return r;
}

static CUresult pack_params(const kdesc_t *k, void **kernelParams, void **extra, unsigned char *pb, size_t *len) {
    if (kernelParams && extra) return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams) {
        for (int i = 0; i < k->nparams; i++) {
            if (!kernelParams[i]) return CUDA_ERROR_INVALID_VALUE;
            memcpy(pb + k->off[i], kernelParams[i], k->size[i]);
        }
        *len = k->total;
        return CUDA_SUCCESS;
    }
    if (extra) {
        void *buf = NULL;
        size_t size = 0;
        int have_size = 0;
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (i > 64) return CUDA_ERROR_INVALID_VALUE;
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
                if (!extra[i + 1]) return CUDA_ERROR_INVALID_VALUE;
                size = *(size_t *)extra[i + 1];
                have_size = 1;
            } else return CUDA_ERROR_INVALID_VALUE;
        }
        if (!buf || !have_size || size < k->total || size > MAXPARAMS) return CUDA_ERROR_INVALID_VALUE;
        memcpy(pb, buf, size);
        *len = size;
        return CUDA_SUCCESS;
    }
    if (k->nparams) return CUDA_ERROR_INVALID_VALUE;
    *len = 0;
    return CUDA_SUCCESS;
}

static CUresult launch_common(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                              unsigned shmem, CUstream s, void **kernelParams, void **extra) {
    CHECK(need_ctx());
    CHECK(stream_validate(s));
    struct func_obj *fo = as_func(f);
    if (!fo) return CUDA_ERROR_INVALID_HANDLE;
    /* DOUBLE_LOAD_AT_LAUNCH_FAILS=1: a launch that would have to load its function fails, as
     * one waits forever on a GPU where a collective of the job waits for its peer */
    if (fo->lazy && ((getenv("DOUBLE_LOAD_AT_LAUNCH_FAILS") && atoi(getenv("DOUBLE_LOAD_AT_LAUNCH_FAILS")))
                     || load_blocked()))
        return CUDA_ERROR_LAUNCH_FAILED;
    fo->lazy = 0;                    /* a launch loads a lazy function */
    launched_any = 1;
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    if ((u64)bx * by * bz > 1024 || bz > 64) return CUDA_ERROR_INVALID_VALUE;
    if (shmem > (unsigned)fo->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES]) return CUDA_ERROR_INVALID_VALUE;
    unsigned char pb[MAXPARAMS] = {0};
    size_t len = 0;
    CHECK(pack_params(fo->k, kernelParams, extra, pb, &len));
    op_t op = {.kind = 1, .func = (void *)fo->k, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .params = pb, .params_len = len};
    if (stream_capture_append(s, &op)) return CUDA_SUCCESS;
    /* CUDA_DOUBLE_PRINTF=1: each launch writes a line to file descriptor 1, as a kernel's printf
     * reaches the process's stdout through the driver */
    if (getenv("CUDA_DOUBLE_PRINTF")) {
        static const char line[] = "double kernel printf\n";
        if (write(1, line, sizeof line - 1) < 0) { /* stdout closed: nothing to tell */ }
    }
    return launch_run(op.func, op.grid, op.block, pb, len);
}

/* A kernel graph node's launch (libcuda_double.c's cuGraphAdd*Node, cuGraph*KernelNodeSetParams):
 * checked and packed as cuLaunchKernel checks and packs, into pb (MAXPARAMS bytes); func, else kern. */
CUresult kernel_node_op(const CUDA_KERNEL_NODE_PARAMS *p, op_t *op, unsigned char *pb);
CUresult kernel_node_op(const CUDA_KERNEL_NODE_PARAMS *p, op_t *op, unsigned char *pb) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct func_obj *fo = as_func(p->func ? (const void *)p->func : (const void *)p->kern);
    if (!fo) return CUDA_ERROR_INVALID_HANDLE;
    unsigned gx = p->gridDimX, gy = p->gridDimY, gz = p->gridDimZ, bx = p->blockDimX, by = p->blockDimY, bz = p->blockDimZ;
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    if ((u64)bx * by * bz > 1024 || bz > 64) return CUDA_ERROR_INVALID_VALUE;
    if (p->sharedMemBytes > (unsigned)fo->attrs[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES]) return CUDA_ERROR_INVALID_VALUE;
    size_t len = 0;
    memset(pb, 0, MAXPARAMS);
    CHECK(pack_params(fo->k, p->kernelParams, p->extra, pb, &len));
    *op = (op_t){.kind = 1, .func = (void *)fo->k, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .params = pb,
                 .params_len = len};
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **kernelParams, void **extra) {
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shmem, CUstream s, void **kernelParams, void **extra) {
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned shmem, CUstream s, void **kernelParams) {
    if (!kernelParams && as_func(f) && as_func(f)->k->nparams) return CUDA_ERROR_INVALID_VALUE;
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, NULL);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **kernelParams) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **kernelParams, void **extra) {
    if (!c || (c->numAttrs && !c->attrs)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < c->numAttrs; i++) {
        const CUlaunchAttribute *a = &c->attrs[i];
        if ((unsigned)a->id > 32) return CUDA_ERROR_INVALID_VALUE;
        if (a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            unsigned x = a->value.clusterDim.x, y = a->value.clusterDim.y, z = a->value.clusterDim.z;
            if (!x || !y || !z || (u64)x * y * z > 16 || c->gridDimX % x || c->gridDimY % y || c->gridDimZ % z)
                return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return launch_common(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                         c->sharedMemBytes, c->hStream, kernelParams, extra);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **kernelParams, void **extra) {
    return cuLaunchKernelEx(c, f, kernelParams, extra);
}

/* Not a driver entry point: a function lookup no interception sees, standing for the private
 * paths CUDA libraries take (cuFFT's functions reach the program without a recorded
 * cuModuleGetFunction). */
API CUresult double_private_get_function(CUfunction *hfunc, CUmodule hmod, const char *name) {
    return module_get_function(hfunc, hmod, name);
}
