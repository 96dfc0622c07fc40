/* Capture hooks: the few things a per-parameter table can't express. Each hook is named
 * by the overlay ("capture": ...) and selected per function through cs_fns[id].hook.
 * Included by shim_core.c. */

/* The real call: a `simple` entry point (at most 6 integer arguments, no float) gets just
 * those registers; others the full generic signature. */
typedef CUresult (*cs_fn6)(U, U, U, U, U, U);
#define CS_CALL_REAL(fn, real, a, d)                                                          \
    ((fn)->simple ? ((cs_fn6)(real))((a)[0], (a)[1], (a)[2], (a)[3], (a)[4], (a)[5])          \
                  : CS_CALL_GENERIC(real, a, d))
#define CS_CALL_GENERIC(real, a, d)                                                           \
    (real)((a)[0], (a)[1], (a)[2], (a)[3], (a)[4], (a)[5], (d)[0], (d)[1], (d)[2], (d)[3], (d)[4], \
           (d)[5], (d)[6], (d)[7], (a)[6], (a)[7], (a)[8], (a)[9], (a)[10], (a)[11], (a)[12],    \
           (a)[13], (a)[14], (a)[15], (a)[16], (a)[17], (a)[18], (a)[19])

typedef CUresult (*cs_fn1)(U);
typedef CUresult (*cs_fn2)(U, U);
typedef CUresult (*cs_fn3)(U, U, U);
typedef CUresult (*cs_fn4)(U, U, U, U);
#define CALLREAL(id, T) ((id) >= 0 && cs_resolve(id) ? (T)cs_resolve(id) : (T)0)

CS_TLS int cs_skip_out;   /* async D2H inside stream capture: no result to keep */
CS_TLS uint64_t cs_post_serial, cs_post_size;  /* memcpy2D host destination blob */
CS_TLS int cs_unified_dst_host;   /* cuMemcpy(Async): the destination is host memory (asked once, before) */
/* cuMemcpyBatchAsync: the copies with a host end, {index, blob serial, size} each: sources before
 * the call, destinations after it (their stream waited for) */
#define CS_BATCH_MAX 256
CS_TLS U *cs_batch_src, *cs_batch_dst;   /* 3 * CS_BATCH_MAX each, made at a thread's first batch */
CS_TLS int cs_batch_nsrc, cs_batch_ndst;
CS_TLS uint64_t cs_batch_dst_mask[CS_BATCH_MAX / 64];

static CUresult cs_hook_passthrough(const cs_fn *fn, cs_gen_fn real, U *a, double *d) {
    return CS_CALL_REAL(fn, real, a, d);
}

static uint32_t cs_array_bytes(const cs_fn *fn, const cs_param *p, const U *a) {
    const cs_param *c = &fn->params[p->len_idx];
    U count = a[c->ai];
    if (p->flags & CS_P_COUNT_PTR) {
        if (!count) return 0;
        count = c->aux == 4 ? *(const uint32_t *)count : *(const uint64_t *)count;
    } else if (c->size < 8) {
        count &= (1ull << (8 * c->size)) - 1;
    }
    U n = count * p->aux;
    return n > (4u << 20) ? (4u << 20) : (uint32_t)n;
}

/* --- kernel parameter layouts, cached per handle -------------------------------------- */
/* An entry is immutable once published; the table holds pointers to entries, so a lock-free
 * reader never sees one half rewritten. Unloading a module or library (or destroying a
 * context) bumps the generation: a handle value the driver hands out again may name another
 * kernel (JIT autotuners load and unload modules by the thousand), so every handle seen after
 * that is asked again and re-identified by a new FN record. Replaced entries are not freed
 * (a reader may still hold one); they are small and few. */
typedef struct { U handle; uint64_t gen; uint32_t n, total; uint32_t *off_size; unsigned flags; } cs_layout;
/* flags: what the kernel's name says, asked once with the layout (shim_window.c, cs_name_flags) */
enum { CS_NF_WINDOW = 1, CS_NF_COLLECTIVE = 2 };
static unsigned cs_name_flags(const char *name);
#define CS_LAYOUTS 16384
static cs_layout *cs_layouts[CS_LAYOUTS];
static uint64_t cs_layout_gen = 1;
static pthread_mutex_t cs_layout_lock = PTHREAD_MUTEX_INITIALIZER;

static void cs_layouts_invalidate(void) { __atomic_add_fetch(&cs_layout_gen, 1, __ATOMIC_ACQ_REL); }

static void cs_emit_fn(U h, int kind, const char *name, const cs_layout *L, U module) {
    uint32_t nl = name ? (uint32_t)strnlen(name, 4096) : 0;
    uint32_t len = (uint32_t)sizeof(cs_rec_hdr) + 3 * cs_flen(8) + cs_flen(nl) + cs_flen(L->n * 8);
    cs_rec r;
    if (cs_reserve(&r, len, CS_REC_FN)) return;
    r.h->t_ns = cs_now();
    cs_put_val(&r, CS_F_HANDLE, h);
    cs_put_val(&r, CS_F_KIND, (U)kind);
    cs_put_val(&r, CS_F_MODULE, module);
    cs_put(&r, CS_F_NAME, CS_T_STR, name ? name : "", nl);
    cs_put(&r, CS_F_LAYOUT, CS_T_BYTES, L->off_size, L->n * 8);
    cs_publish(&r);
}

/* The name of a function or kernel handle (NULL when the driver gives none); *kind in: 1 when
 * its layout answered as a CUkernel (asked first as one), out: 1 when its name did. A lazily
 * loaded function (CUDA_MODULE_LOADING=LAZY: the handle that cudaGetFuncBySymbol returns, as
 * NCCL launches it) has no name before it is loaded; it is loaded here, as its launch would
 * load it, and asked again. */
static const char *cs_kernel_name(U h, int *kind) {
    const char *nm = NULL;
    cs_fn2 gn = CALLREAL(CS_ID_cuFuncGetName, cs_fn2), kn = CALLREAL(CS_ID_cuKernelGetName, cs_fn2);
    if (*kind == 1 && kn && kn((U)&nm, h) == 0 && nm) return nm;
    *kind = 0;
    if (gn && gn((U)&nm, h) == 0 && nm) return nm;
    if (kn && kn((U)&nm, h) == 0 && nm) { *kind = 1; return nm; }
    cs_fn2 isl = CALLREAL(CS_ID_cuFuncIsLoaded, cs_fn2);
    cs_fn1 load = CALLREAL(CS_ID_cuFuncLoad, cs_fn1);
    int state = -1;
    if (!isl || !load || isl((U)&state, h) != 0 || state != 0 /* CU_FUNCTION_LOADING_STATE_UNLOADED */)
        return NULL;
    /* relaxed on this thread while it loads: a stream capture in global mode elsewhere must not
     * see a load it would refuse (the launch that follows loads it inside the driver) */
    cs_fn1 xm = CALLREAL(CS_ID_cuThreadExchangeStreamCaptureMode, cs_fn1);
    int mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
    int swapped = xm && xm((U)&mode) == 0;
    CUresult lr = load(h);
    if (swapped) xm((U)&mode);
    if (lr == 0 && gn && gn((U)&nm, h) == 0 && nm) return nm;
    return NULL;
}

/* Parameter offsets and sizes of h: cuFuncGetParamInfo, else cuKernelGetParamInfo (the
 * runtime passes CUkernel handles cast to CUfunction). kind: 0 function, 1 kernel. */
static int cs_query_layout(U h, cs_layout *L) {
    cs_fn4 fpi = CALLREAL(CS_ID_cuFuncGetParamInfo, cs_fn4);
    cs_fn4 kpi = CALLREAL(CS_ID_cuKernelGetParamInfo, cs_fn4);
    int kind = 0;
    uint32_t cap = 16, n = 0, total = 0;
    uint32_t *os = malloc(cap * 8);
    for (int pass = 0; pass < 2 && os; pass++) {
        cs_fn4 q = pass == 0 ? fpi : kpi;
        if (!q) continue;
        n = 0; total = 0;
        for (;;) {
            size_t off = 0, size = 0;
            if (q(h, n, (U)&off, (U)&size) != 0) break;
            if (n == cap) { cap *= 2; uint32_t *g = realloc(os, cap * 8); if (!g) break; os = g; }
            os[2 * n] = (uint32_t)off; os[2 * n + 1] = (uint32_t)size;
            if (off + size > total) total = (uint32_t)(off + size);
            n++;
        }
        if (n > 0 || q(h, 0, (U)&(size_t){0}, (U)&(size_t){0}) == 1 /* INVALID_VALUE: no params */) {
            kind = pass; break;
        }
    }
    L->n = n; L->total = total; L->off_size = os;
    return kind;
}

/* Layout of a function or kernel handle; emits an FN record (name, module, layout) the first
 * time the handle is seen in this generation, whatever call it first appears in. */
static const cs_layout *cs_layout_of(U h) {
    uint64_t gen = __atomic_load_n(&cs_layout_gen, __ATOMIC_ACQUIRE);
    uint64_t slot = (h >> 4) * 0x9E3779B97F4A7C15ull;
    for (unsigned probe = 0; probe < CS_LAYOUTS; probe++) {
        cs_layout *L = __atomic_load_n(&cs_layouts[(slot + probe) & (CS_LAYOUTS - 1)], __ATOMIC_ACQUIRE);
        if (!L) break;
        if (L->handle == h && L->gen == gen) return L;
    }
    pthread_mutex_lock(&cs_layout_lock);
    gen = __atomic_load_n(&cs_layout_gen, __ATOMIC_ACQUIRE);
    int free_at = -1;
    for (unsigned probe = 0; probe < CS_LAYOUTS; probe++) {
        unsigned i = (unsigned)((slot + probe) & (CS_LAYOUTS - 1));
        cs_layout *c = cs_layouts[i];
        if (c && c->handle == h && c->gen == gen) { pthread_mutex_unlock(&cs_layout_lock); return c; }
        if (free_at < 0 && (!c || c->gen != gen)) free_at = (int)i;   /* empty, or stale: reusable */
        if (!c) break;
    }
    cs_layout *L = free_at >= 0 ? calloc(1, sizeof *L) : NULL;
    if (!L) { pthread_mutex_unlock(&cs_layout_lock); return NULL; }
    int kind = cs_query_layout(h, L);
    int named_as = kind;
    const char *nm = cs_kernel_name(h, &named_as);
    if (!nm) nm = "";
    else if (named_as) kind = 1;     /* a CUkernel after all */
    L->flags = cs_name_flags(nm);
    U module = 0;
    cs_fn2 gm = CALLREAL(CS_ID_cuFuncGetModule, cs_fn2);
    if (kind == 0 && gm) gm((U)&module, h);
    L->handle = h; L->gen = gen;
    __atomic_store_n(&cs_layouts[free_at], L, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cs_layout_lock);
    cs_emit_fn(h, kind, nm, L, module);
    return L;
}

/* --- contexts, identified at first sight ----------------------------------------------- */
/* Runtimes reach their primary context through private paths, so a context handle may first
 * appear as an argument. Its device, and whether it is that device's primary context, are
 * recorded (CTX record) before the call; a destroyed context's value may come back, so the
 * unload hook forgets them all. */
#define CS_CTXS 64
static U cs_ctx_seen[CS_CTXS];
static pthread_mutex_t cs_ctx_lock = PTHREAD_MUTEX_INITIALIZER;

static void cs_ctx_forget(void) {
    pthread_mutex_lock(&cs_ctx_lock);
    for (int i = 0; i < CS_CTXS; i++) __atomic_store_n(&cs_ctx_seen[i], 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cs_ctx_lock);
}

static int cs_ctx_device(U ctx) {
    int dev = -1;
    cs_fn2 gd2 = CALLREAL(CS_ID_cuCtxGetDevice_v2, cs_fn2);
    if (gd2 && gd2((U)&dev, ctx) == 0) return dev;
    cs_fn2 push = CALLREAL(CS_ID_cuCtxPushCurrent_v2, cs_fn2), pop = CALLREAL(CS_ID_cuCtxPopCurrent_v2, cs_fn2);
    cs_fn2 gd = CALLREAL(CS_ID_cuCtxGetDevice, cs_fn2);
    if (push && pop && gd && ((CUresult(*)(U))push)(ctx) == 0) {
        if (((CUresult(*)(U))gd)((U)&dev) != 0) dev = -1;
        U was = 0;
        ((CUresult(*)(U))pop)((U)&was);
    }
    return dev;
}

static void cs_ctx_identify(U ctx) {
    for (int i = 0; i < CS_CTXS; i++) {
        U v = __atomic_load_n(&cs_ctx_seen[i], __ATOMIC_ACQUIRE);
        if (v == ctx) return;
        if (!v) break;
    }
    pthread_mutex_lock(&cs_ctx_lock);
    int slot = -1;
    for (int i = 0; i < CS_CTXS; i++) {
        if (cs_ctx_seen[i] == ctx) { pthread_mutex_unlock(&cs_ctx_lock); return; }
        if (!cs_ctx_seen[i]) { slot = i; break; }
    }
    if (slot < 0) { pthread_mutex_unlock(&cs_ctx_lock); return; }
    int dev = cs_ctx_device(ctx), primary = 2;   /* 0 no, 1 yes, 2 unknown */
    if (dev >= 0) {
        /* the primary context is retained (and released at once) only while it is active,
         * so this never creates one; the runtime makes its primary context current before
         * it retains it, and then nothing can tell yet */
        cs_fn3 st = CALLREAL(CS_ID_cuDevicePrimaryCtxGetState, cs_fn3);
        cs_fn2 retain = CALLREAL(CS_ID_cuDevicePrimaryCtxRetain, cs_fn2);
        cs_fn2 release = CALLREAL(CS_ID_cuDevicePrimaryCtxRelease_v2, cs_fn2);
        unsigned flags = 0;
        int active = 0;
        U p = 0;
        if (st && retain && release && st((U)dev, (U)&flags, (U)&active) == 0 && active
            && retain((U)&p, (U)dev) == 0) {
            primary = p == ctx;
            ((CUresult(*)(U))release)((U)dev);
        }
    }
    __atomic_store_n(&cs_ctx_seen[slot], ctx, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&cs_ctx_lock);
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + 3 * cs_flen(8), CS_REC_CTX)) return;
    r.h->t_ns = cs_now();
    cs_put_val(&r, CS_F_HANDLE, ctx);
    cs_put_val(&r, CS_F_CODE, (U)(int64_t)dev);
    cs_put_val(&r, CS_F_KIND, (U)primary);
    cs_publish(&r);
}

/* Packed parameter bytes of function/kernel handle f: from the `extra` buffer form, or
 * from kernelParams through the handle's layout. */
static uint32_t cs_pack_size(U f, U kparams, U extra, const void **src, const cs_layout **lay) {
    *src = NULL; *lay = NULL;
    (void)kparams;
    if (extra) {
        void **e = (void **)extra;
        void *buf = NULL; size_t size = 0;
        for (int i = 0; i < 16 && e[i]; i += 2) {
            if (e[i] == (void *)1) buf = e[i + 1];
            else if (e[i] == (void *)2) size = *(size_t *)e[i + 1];
            else break;
        }
        if (buf && size <= 65536) { *src = buf; return (uint32_t)size; }
        return 0;
    }
    if (!f) return 0;
    const cs_layout *L = cs_layout_of(f);
    *lay = L;
    return L ? L->total : 0;
}

static void cs_put_packed(cs_rec *r, uint32_t n, const void *src, const cs_layout *L, U kparams) {
    cs_field_hdr *fh = (cs_field_hdr *)r->p;
    fh->idx = CS_F_PARAMS; fh->tag = CS_T_BYTES; fh->len = n;
    char *dst = (char *)(fh + 1);
    if (src) memcpy(dst, src, n);
    else if (L && n) {
        void **kp = (void **)kparams;
        memset(dst, 0, n);
        for (uint32_t i = 0; kp && i < L->n; i++)
            memcpy(dst + L->off_size[2 * i], kp[i], L->off_size[2 * i + 1]);
    }
    r->p += cs_flen(n); r->h->nfields++;
}

/* Where the launch-like arguments of a call are: (handle, kernelParams, extra). Launches
 * take them as arguments; kernel graph nodes inside a CUDA_KERNEL_NODE_PARAMS struct
 * (h0 = struct param, h1 = its offset in the argument, h2 = 1 when it has `kern`). */
static int cs_launch_args(const cs_fn *fn, const U *a, U *f, U *kp, U *ex) {
    if (fn->hook == CS_H_LAUNCH) {
        *f = a[fn->params[fn->h0].ai];
        *kp = fn->h1 >= 0 ? a[fn->params[fn->h1].ai] : 0;
        *ex = fn->h2 >= 0 ? a[fn->params[fn->h2].ai] : 0;
        return 1;
    }
    if (fn->hook == CS_H_KNODE) {
        const char *s = (const char *)a[fn->params[fn->h0].ai];
        if (!s) return 0;
        if (fn->h1 == 16 && *(const uint32_t *)s != 0) return 0;   /* CUgraphNodeParams: not a kernel node */
        s += fn->h1;
        *f = *(const U *)s;
        if (!*f && fn->h2 == 1) *f = *(const U *)(s + 56);            /* CUkernel `kern` */
        *kp = *(const U *)(s + 40);
        *ex = *(const U *)(s + 48);
        return 1;
    }
    return 0;
}

static uint32_t cs_attrs_bytes(const cs_fn *fn, const U *a) {
    if (fn->hook != CS_H_LAUNCH || fn->h2 < 0 || fn->h0 != 1) return 0;   /* cuLaunchKernelEx: (config, f, ...) */
    const char *cfg = (const char *)a[fn->params[0].ai];
    if (!cfg) return 0;
    uint32_t na = *(const uint32_t *)(cfg + CS_LAUNCHCFG_NUMATTRS_OFF);
    if (!*(const void *const *)(cfg + CS_LAUNCHCFG_ATTRS_OFF)) return 0;   /* the driver's to refuse */
    if (na > 64) na = 64;
    return na * CS_SIZEOF_LAUNCHATTR;
}

/* Size of a module image handed to cuModuleLoadData & co: ELF, fatbin, or PTX text. */
static uint64_t cs_image_size(const void *img, const void **start) {
    const unsigned char *p = img;
    *start = img;
    if (!p) return 0;
    uint32_t magic = *(const uint32_t *)p;
    if (magic == 0x466243b1u) {            /* __fatBinC_Wrapper_t: follow the data pointer */
        p = *(const unsigned char *const *)(p + 8);
        *start = p;
        magic = *(const uint32_t *)p;
    }
    if (magic == 0xBA55ED50u) {            /* fatbin: header size u16 @6, body size u64 @8 */
        return (uint64_t)*(const uint16_t *)(p + 6) + *(const uint64_t *)(p + 8);
    }
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {
        uint64_t shoff = *(const uint64_t *)(p + 0x28), phoff = *(const uint64_t *)(p + 0x20);
        uint16_t shentsize = *(const uint16_t *)(p + 0x3A), shnum = *(const uint16_t *)(p + 0x3C);
        uint16_t phentsize = *(const uint16_t *)(p + 0x36), phnum = *(const uint16_t *)(p + 0x38);
        uint64_t end = shoff + (uint64_t)shentsize * shnum, end2 = phoff + (uint64_t)phentsize * phnum;
        /* sections may sit after the header table: take the furthest section end */
        for (uint16_t i = 0; i < shnum && shoff; i++) {
            const unsigned char *s = p + shoff + (uint64_t)i * shentsize;
            uint32_t type = *(const uint32_t *)(s + 4);
            uint64_t off = *(const uint64_t *)(s + 0x18), size = *(const uint64_t *)(s + 0x20);
            if (type != 8 /* NOBITS */ && off + size > end) end = off + size;
        }
        return end > end2 ? end : end2;
    }
    return strnlen((const char *)p, 1u << 30) + 1;   /* PTX or other text: NUL-terminated */
}

static uint64_t cs_read_file_blob(const char *path) {
    if (!path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    uint64_t serial = 0;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) { serial = cs_blob(m, (uint64_t)st.st_size); munmap(m, (size_t)st.st_size); }
    }
    close(fd);
    return serial;
}

/* memcpy2D host side: the bytes a CUDA_MEMCPY2D reads from (or writes to) host memory. */
static int cs_memcpy2d_host(const char *c, int dst, const char **ptr, uint64_t *size) {
    /* CUDA_MEMCPY2D: srcXInBytes 0, srcY 8, srcMemoryType 16, srcHost 24, srcDevice 32,
     * srcArray 40, srcPitch 48, dstXInBytes 56, dstY 64, dstMemoryType 72, dstHost 80,
     * dstDevice 88, dstArray 96, dstPitch 104, WidthInBytes 112, Height 120 */
    int base = dst ? 56 : 0;
    uint32_t mt = *(const uint32_t *)(c + base + 16);
    if (mt != 1 /* CU_MEMORYTYPE_HOST */) return 0;
    uint64_t x = *(const uint64_t *)(c + base), y = *(const uint64_t *)(c + base + 8);
    uint64_t pitch = *(const uint64_t *)(c + base + 48);
    uint64_t w = *(const uint64_t *)(c + 112), h = *(const uint64_t *)(c + 120);
    const char *host = *(const char *const *)(c + base + 24);
    if (!host || !h || !w) return 0;
    if (pitch < w) pitch = w;
    *ptr = host + x + y * pitch;
    *size = pitch * (h - 1) + w;
    return 1;
}

/* memcpy3D host side, as cs_memcpy2d_host: the bytes a CUDA_MEMCPY3D reads from (or writes to)
 * host memory, slices of srcHeight rows included. */
static int cs_memcpy3d_host(const char *c, int dst, const char **ptr, uint64_t *size) {
    /* CUDA_MEMCPY3D: srcXInBytes 0, srcY 8, srcZ 16, srcMemoryType 32, srcHost 40, srcPitch 72,
     * srcHeight 80; dst* the same + 88; WidthInBytes 176, Height 184, Depth 192 */
    int base = dst ? 88 : 0;
    if (*(const uint32_t *)(c + base + 32) != 1 /* CU_MEMORYTYPE_HOST */) return 0;
    uint64_t x = *(const uint64_t *)(c + base), y = *(const uint64_t *)(c + base + 8), z = *(const uint64_t *)(c + base + 16);
    uint64_t pitch = *(const uint64_t *)(c + base + 72), rows = *(const uint64_t *)(c + base + 80);
    uint64_t w = *(const uint64_t *)(c + 176), h = *(const uint64_t *)(c + 184), d = *(const uint64_t *)(c + 192);
    const char *host = *(const char *const *)(c + base + 40);
    if (!host || !w || !h || !d) return 0;
    if (pitch < w) pitch = w;
    if (rows < h) rows = h;
    *ptr = host + x + y * pitch + z * pitch * rows;
    *size = pitch * rows * (d - 1) + pitch * (h - 1) + w;
    return 1;
}

/* The host bytes of a copy struct; fn->h0 names its layout (build_shim.py: 2 CUDA_MEMCPY2D,
 * 3 CUDA_MEMCPY3D, 0 one whose host side is not read). */
static int cs_memcpy_struct_host(const cs_fn *fn, const char *c, int dst, const char **ptr, uint64_t *size) {
    if (fn->h0 == 2) return cs_memcpy2d_host(c, dst, ptr, size);
    if (fn->h0 == 3) return cs_memcpy3d_host(c, dst, ptr, size);
    return 0;
}

/* Host memory, to the driver: pinned (memory type HOST) or unknown to it (pageable). */
static int cs_is_host_ptr(U p) {
    enum { MEMORY_TYPE = 2, MEMORYTYPE_HOST = 1 };
    cs_fn3 q = CALLREAL(CS_ID_cuPointerGetAttribute, cs_fn3);
    unsigned type = 0;
    if (!p || !q) return 0;
    if (q((U)&type, MEMORY_TYPE, p) != 0) return 1;
    return type == MEMORYTYPE_HOST;
}

/* What the pre-call record of a hooked call carries, worked out once per call: packed
 * kernel arguments (launches, kernel graph nodes), launch attributes, or a blob (module
 * image or file, memcpy2D host source) streamed into the ring before the record. */
typedef struct {
    int packed;                 /* launch-like: a CS_F_PARAMS field follows */
    uint32_t pbytes, abytes;    /* packed argument bytes, launch attribute bytes */
    const void *src;            /* `extra` buffer, or NULL: pack kernelParams through lay */
    const cs_layout *lay;
    U kp;
    uint16_t blob_field;        /* CS_F_IMAGE / CS_F_HOSTSRC / CS_F_HOSTCHECK, or 0 */
    uint64_t serial, size;      /* the blob streamed for it */
    int nhm;                    /* launch: managed allocations recorded with it (shim_hostmem.c) */
    int batch;                  /* cuMemcpyBatchAsync: cs_batch_src holds its host sources */
    U hm[3 * CS_HM_PER_LAUNCH]; /* last: not cleared per call (only its first nhm entries are read) */
} cs_pre;

static void cs_hook_pre(const cs_fn *fn, const U *a, cs_pre *pre) {
    memset(pre, 0, offsetof(cs_pre, hm));     /* hm is written only where nhm says */
    switch (fn->hook) {
    case CS_H_LAUNCH: case CS_H_KNODE: {
        U f = 0, ex = 0;
        if (!cs_launch_args(fn, a, &f, &pre->kp, &ex)) return;   /* not a kernel node */
        pre->packed = 1;
        pre->pbytes = cs_pack_size(f, pre->kp, ex, &pre->src, &pre->lay);
        pre->abytes = cs_attrs_bytes(fn, a);
        if (cs_hm_n && fn->hook == CS_H_LAUNCH)
            pre->nhm = cs_hm_launch(pre->src, pre->pbytes, (void *const *)pre->kp, pre->lay ? pre->lay->off_size : NULL,
                                    pre->lay ? pre->lay->n : 0, pre->hm);
        return;
    }
    case CS_H_HOST_FREE:
        if (cs_hm_n) {
            pre->serial = cs_hm_free(a[fn->params[fn->h0].ai], &pre->size);
            if (pre->serial) pre->blob_field = CS_F_HOSTCHECK;
        }
        return;
    case CS_H_PLACE:
        if (cs_hm_n && strcmp(fn->name, "cuMemFree_v2") == 0) {
            pre->serial = cs_hm_free(a[fn->params[0].ai], &pre->size);
            if (pre->serial) pre->blob_field = CS_F_HOSTCHECK;
        }
        return;
    case CS_H_MODULE_IMAGE: {
        const void *start;
        pre->blob_field = CS_F_IMAGE;
        pre->size = cs_image_size((const void *)a[fn->params[fn->h0].ai], &start);
        if (pre->size) pre->serial = cs_blob(start, pre->size);
        return;
    }
    case CS_H_MODULE_FILE:
        pre->blob_field = CS_F_IMAGE;
        pre->serial = cs_read_file_blob((const char *)a[fn->params[fn->h0].ai]);
        return;
    case CS_H_MEMCPY_UNIFIED: {
        U src = a[fn->params[fn->h2].ai], n = a[fn->params[2].ai];
        cs_unified_dst_host = n && cs_is_host_ptr(a[fn->params[fn->h1].ai]);   /* for cs_hook_after */
        if (n && cs_is_host_ptr(src)) {
            pre->blob_field = CS_F_HOSTSRC;
            pre->size = n;
            pre->serial = cs_blob((const void *)src, n);
        }
        return;
    }
    case CS_H_MEMCPY_BATCH: {
        const U *dst = (const U *)a[fn->params[0].ai], *src = (const U *)a[fn->params[1].ai];
        const U *size = (const U *)a[fn->params[2].ai];
        U n = a[fn->params[3].ai];
        cs_batch_nsrc = 0;
        memset(cs_batch_dst_mask, 0, sizeof cs_batch_dst_mask);
        if (!cs_batch_src) cs_batch_src = malloc(3 * CS_BATCH_MAX * sizeof(U));
        if (!cs_batch_dst) cs_batch_dst = malloc(3 * CS_BATCH_MAX * sizeof(U));
        if (!dst || !src || !size || !cs_batch_src || !cs_batch_dst) return;
        pre->batch = 1;
        if (n > CS_BATCH_MAX) cs_note("cuMemcpyBatchAsync of more than 256 copies: host ends past the 256th not recorded");
        for (U i = 0; i < n && i < CS_BATCH_MAX; i++) {
            if (!size[i]) continue;
            if (cs_is_host_ptr(src[i])) {
                U *e = &cs_batch_src[3 * cs_batch_nsrc++];
                e[0] = i; e[1] = cs_blob((const void *)src[i], size[i]); e[2] = size[i];
            }
            if (cs_is_host_ptr(dst[i])) cs_batch_dst_mask[i / 64] |= 1ull << (i % 64);
        }
        return;
    }
    case CS_H_MEMCPY_STRUCT: {
        const char *c = (const char *)a[fn->params[0].ai], *hp;
        pre->blob_field = CS_F_HOSTSRC;
        if (c && cs_memcpy_struct_host(fn, c, 0, &hp, &pre->size))
            pre->serial = cs_blob(hp, pre->size);
        else
            pre->size = 0;
        return;
    }
    default: return;
    }
}

static uint32_t cs_hook_pre_size(const cs_pre *pre) {
    uint32_t n = 0;
    if (pre->packed) n += cs_flen(pre->pbytes) + (pre->abytes ? cs_flen(pre->abytes) : 0);
    if (pre->blob_field) n += cs_flen(16);
    if (pre->nhm) n += cs_flen(24u * (uint32_t)pre->nhm);
    if (pre->batch && cs_batch_nsrc) n += cs_flen(24u * (uint32_t)cs_batch_nsrc);
    return n;
}

static void cs_hook_pre_fields(const cs_fn *fn, cs_rec *r, const U *a, const cs_pre *pre) {
    if (pre->packed) {
        cs_put_packed(r, pre->pbytes, pre->src, pre->lay, pre->kp);
        if (pre->abytes) {
            const char *cfg = (const char *)a[fn->params[0].ai];
            cs_put(r, CS_F_ATTRS, CS_T_BYTES, *(const void *const *)(cfg + CS_LAUNCHCFG_ATTRS_OFF), pre->abytes);
        }
    }
    if (pre->blob_field) cs_put_blobref(r, pre->blob_field, pre->serial, pre->size);
    if (pre->nhm) cs_put(r, CS_F_HOSTMEM, CS_T_BYTES, pre->hm, 24u * (uint32_t)pre->nhm);
    if (pre->batch && cs_batch_nsrc) cs_put(r, CS_F_BATCHSRC, CS_T_BYTES, cs_batch_src, 24u * (uint32_t)cs_batch_nsrc);
}

static void cs_emit_proc(void) {
    int ver = 0, count = 0;
    cs_fn2 dv = CALLREAL(CS_ID_cuDriverGetVersion, cs_fn2);
    cs_fn2 dc = CALLREAL(CS_ID_cuDeviceGetCount, cs_fn2);
    if (dv) dv((U)&ver, 0);
    if (dc) dc((U)&count, 0);
    if (count > 16) count = 16;
    /* per device: name[256], uuid[16], cc major, cc minor, total mem */
    char info[16][256 + 16 + 24];
    memset(info, 0, sizeof info);
    cs_fn2 dg = CALLREAL(CS_ID_cuDeviceGet, cs_fn2);
    cs_fn3 nm = CALLREAL(CS_ID_cuDeviceGetName, cs_fn3);
    cs_fn2 uu = CALLREAL(CS_ID_cuDeviceGetUuid_v2, cs_fn2);
    if (!uu) uu = CALLREAL(CS_ID_cuDeviceGetUuid, cs_fn2);
    cs_fn3 at = CALLREAL(CS_ID_cuDeviceGetAttribute, cs_fn3);
    cs_fn2 tm = CALLREAL(CS_ID_cuDeviceTotalMem_v2, cs_fn2);
    for (int i = 0; i < count; i++) {
        int dev = 0;
        if (dg && dg((U)&dev, (U)i) != 0) continue;
        char *o = info[i];
        if (nm) nm((U)o, 255, (U)dev);
        if (uu) uu((U)(o + 256), (U)dev);
        int maj = 0, min = 0; size_t mem = 0;
        if (at) { at((U)&maj, 75, (U)dev); at((U)&min, 76, (U)dev); }
        if (tm) tm((U)&mem, (U)dev);
        memcpy(o + 272, &maj, 4); memcpy(o + 276, &min, 4); memcpy(o + 280, &mem, 8);
    }
    cs_rec r;
    uint32_t len = (uint32_t)sizeof(cs_rec_hdr) + 2 * cs_flen(8) + cs_flen((uint32_t)(count * sizeof info[0]));
    if (cs_reserve(&r, len, CS_REC_PROC)) return;
    r.h->t_ns = cs_now();
    cs_put_val(&r, CS_F_CODE, (U)ver);
    cs_put_val(&r, CS_F_KIND, (U)count);
    cs_put(&r, CS_F_INFO, CS_T_BYTES, info, (uint32_t)(count * sizeof info[0]));
    cs_publish(&r);
}

/* cuGetProcAddress: map the real pointer handed back to an API id, answer with our wrapper. */
typedef struct { void *p; int id; } cs_pmap;
static cs_pmap *cs_ptrmap;
static int cs_nptr;
static pthread_mutex_t cs_ptr_lock = PTHREAD_MUTEX_INITIALIZER;
static int cs_pmap_cmp(const void *x, const void *y) {
    const cs_pmap *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p ? 1 : a->id - b->id;
}

static int cs_id_of_pointer(void *p, const char *symbol) {
    pthread_mutex_lock(&cs_ptr_lock);
    if (!cs_ptrmap) {
        void *h = cs_cuda_handle();
        cs_pmap *m = calloc(CS_NFN, sizeof *m);
        int n = 0;
        for (int i = 0; m && h && i < CS_NFN; i++) {
            void *q = cs_dlsym(h, cs_fns[i].name);
            if (q) { m[n].p = q; m[n].id = i; n++; }
        }
        if (m) qsort(m, n, sizeof *m, cs_pmap_cmp);
        cs_ptrmap = m; cs_nptr = n;
    }
    pthread_mutex_unlock(&cs_ptr_lock);
    int best = -1;
    for (int lo = 0, hi = cs_nptr - 1; lo <= hi;) {
        int mid = (lo + hi) / 2;
        if (cs_ptrmap[mid].p < p) lo = mid + 1;
        else if (cs_ptrmap[mid].p > p) hi = mid - 1;
        else {
            while (mid > 0 && cs_ptrmap[mid - 1].p == p) mid--;
            for (; mid < cs_nptr && cs_ptrmap[mid].p == p; mid++) {
                int id = cs_ptrmap[mid].id;
                if (best < 0 || strcmp(cs_fns[id].base, symbol) == 0) best = id;
            }
            break;
        }
    }
    if (best < 0) best = cs_lookup(symbol);   /* not exported: trust an exact ABI name */
    return best;
}

/* An async copy's host result exists once its stream is done: wait for it, unless the stream
 * is being captured into a graph (then there is nothing to read yet: returns 0). */
static int cs_await_stream(const cs_fn *fn, U stream) {
    int ptsz = strstr(fn->name, "_pt") != NULL, capturing = 0;
    cs_fn2 isc = CALLREAL(ptsz ? CS_ID_cuStreamIsCapturing_ptsz : CS_ID_cuStreamIsCapturing, cs_fn2);
    if (isc && isc(stream, (U)&capturing) == 0 && capturing) return 0;
    cs_fn2 sync = CALLREAL(ptsz ? CS_ID_cuStreamSynchronize_ptsz : CS_ID_cuStreamSynchronize, cs_fn2);
    if (sync) ((CUresult(*)(U))sync)(stream);
    return 1;
}

CS_TLS int cs_last_wrapped = -2;
static void cs_place_after(const cs_fn *fn, const U *a, CUresult res);
static void cs_share_after(const cs_fn *fn, const U *a, CUresult res);
CS_TLS int cs_link_ok;
CS_TLS int64_t cs_link[8];

static void cs_hook_after(const cs_fn *fn, int id, U *a, CUresult res) {
    (void)id;
    cs_skip_out = 0;
    if (cs_hm_n) cs_hm_tick(fn, res);
    switch (fn->hook) {
    case CS_H_HOST_ALLOC: {
        /* managed memory (h2 < 0), or with CUDASNAP_MAPPED_MEMORY=1 pinned host memory mapped for
         * the device (DEVICEMAP, 2): off by default, since libraries keep their own host-written
         * state there (NCCL's work FIFO reaches its kernels), which a replay does not rewrite */
        enum { DEVICEMAP = 2 };
        static int mapped = -1;
        if (mapped < 0) { const char *e = getenv("CUDASNAP_MAPPED_MEMORY"); mapped = e && *e == '1'; }
        U p = a[fn->params[fn->h0].ai];
        if (res != 0 || !p || (fn->h2 >= 0 && (!mapped || !(a[fn->params[fn->h2].ai] & DEVICEMAP)))) return;
        cs_hm_add(fn->params[fn->h0].kind == CS_K_OUT ? *(const U *)p : p, a[fn->params[fn->h1].ai]);   /* pp, or p itself */
        return;
    }
    case CS_H_GETPROC: {
        cs_last_wrapped = -2;
        void **pfn = (void **)a[fn->params[1].ai];
        const char *sym = (const char *)a[fn->params[0].ai];
        if (res != 0 || !pfn || !*pfn || !sym) return;
        if (strcmp(sym, "cuGetExportTable") == 0) { cs_last_wrapped = -1; return; }
        int wid = cs_is_ours(*pfn) ? -1 : cs_id_of_pointer(*pfn, sym);
        if (wid < 0) {   /* one of our wrappers came back: find which */
            for (int k = 0; k < CS_NFN; k++) if (cs_wrappers[k] == *pfn) { wid = k; break; }
        }
        if (wid < 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown entry point %s requested: passed through, calls not recorded", sym);
            cs_note(msg);
            cs_last_wrapped = -1;
            return;
        }
        void *w = cs_wrap(wid, *pfn);
        cs_last_wrapped = w == cs_wrappers[wid] ? wid : -1;
        *pfn = w;
        return;
    }
    case CS_H_INIT:
        if (res == 0) cs_emit_proc();
        return;
    case CS_H_PLACE:
        cs_place_after(fn, a, res);
        return;
    case CS_H_UNLOAD:
        if (res == 0) { cs_layouts_invalidate(); cs_ctx_forget(); }
        return;
    case CS_H_SHARE:
        cs_share_after(fn, a, res);
        return;
    case CS_H_MEMCPY_STRUCT: {
        const char *c = (const char *)a[fn->params[0].ai], *hp; uint64_t n;
        cs_post_serial = cs_post_size = 0;
        if (res == 0 && c && cs_memcpy_struct_host(fn, c, 1, &hp, &n)) {
            cs_post_serial = cs_blob(hp, n); cs_post_size = n;
        }
        return;
    }
    case CS_H_MEMCPY_UNIFIED: {
        U dst = a[fn->params[fn->h1].ai], n = a[fn->params[2].ai];
        cs_post_serial = cs_post_size = 0;
        if (res != 0 || !cs_unified_dst_host) return;
        if (fn->h0 >= 0 && !cs_await_stream(fn, a[fn->params[fn->h0].ai])) return;
        cs_post_serial = cs_blob((const void *)dst, n); cs_post_size = n;
        return;
    }
    case CS_H_MEMCPY_BATCH: {
        cs_batch_ndst = 0;
        int any = 0;
        for (int k = 0; k < CS_BATCH_MAX / 64; k++) any |= cs_batch_dst_mask[k] != 0;
        if (res != 0 || !any || !cs_batch_dst || !cs_await_stream(fn, a[fn->params[fn->h0].ai])) return;
        const U *dst = (const U *)a[fn->params[0].ai], *size = (const U *)a[fn->params[2].ai];
        for (U i = 0; i < CS_BATCH_MAX && cs_batch_ndst < CS_BATCH_MAX; i++)
            if (cs_batch_dst_mask[i / 64] >> (i % 64) & 1) {
                U *e = &cs_batch_dst[3 * cs_batch_ndst++];
                e[0] = i; e[1] = cs_blob((const void *)dst[i], size[i]); e[2] = size[i];
            }
        return;
    }
    case CS_H_ASYNC_D2H: {
        if (res != 0) return;
        /* The result exists only once the copy finishes: wait for it, unless the stream
         * is being captured into a graph (then there is nothing to read yet). */
        if (!cs_await_stream(fn, fn->h0 >= 0 ? a[fn->params[fn->h0].ai] : 0)) cs_skip_out = 1;
        return;
    }
    default: return;
    }
}

static uint32_t cs_hook_post_size(const cs_fn *fn, const U *a, CUresult res) {
    (void)res;
    if (fn->hook == CS_H_GETPROC) return cs_flen(8);
    if (fn->hook == CS_H_SHARE) return cs_link_ok ? cs_flen(sizeof cs_link) : 0;
    if ((fn->hook == CS_H_MEMCPY_STRUCT || fn->hook == CS_H_MEMCPY_UNIFIED) && res == 0 && cs_post_serial) return cs_flen(16);
    if (fn->hook == CS_H_MEMCPY_BATCH && res == 0 && cs_batch_ndst) return cs_flen(24u * (uint32_t)cs_batch_ndst);
    (void)a;
    return 0;
}

static void cs_hook_post_fields(const cs_fn *fn, cs_rec *r, const U *a, CUresult res) {
    if (fn->hook == CS_H_GETPROC) { cs_put_val(r, CS_F_WRAPPED, (U)(int64_t)cs_last_wrapped); return; }
    if (fn->hook == CS_H_SHARE) { if (cs_link_ok) cs_put(r, CS_F_LINK, CS_T_BYTES, cs_link, sizeof cs_link); return; }
    if ((fn->hook == CS_H_MEMCPY_STRUCT || fn->hook == CS_H_MEMCPY_UNIFIED) && res == 0 && cs_post_serial)
        cs_put_blobref(r, CS_F_HOSTDST, cs_post_serial, cs_post_size);
    if (fn->hook == CS_H_MEMCPY_BATCH && res == 0 && cs_batch_ndst)
        cs_put(r, CS_F_BATCHDST, CS_T_BYTES, cs_batch_dst, 24u * (uint32_t)cs_batch_ndst);
    (void)a;
}
