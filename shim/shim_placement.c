/* Placement: cudasnap capture puts device allocations into a tool-owned virtual address
 * region, so replay can reserve the very same addresses first (the addresses the
 * driver picks for small allocations move with host ASLR and can't be reserved again).
 *
 * cuMemAlloc_v2 becomes VMM inside the region: large allocations get their own
 * granule-aligned range; small ones are packed into 2 MiB slabs (refcounted, released
 * when empty). cuMemAddressReserve with no address hint gets a hint inside the region.
 * cuMemFree_v2 and cuMemGetAddressRange_v2 answer for the packed allocations.
 * Off with CUDASNAP_PLACEMENT=off (then the driver places everything, as without capture).
 * Included by shim_core.c. */

/* Allocation zone: ONE reservation made on the first allocation (the driver honours the
 * hint of a large reservation at a fixed address, not of small ones), recorded as a
 * REGION record so replay reserves the same range before anything else. */
#define CS_ZONE_SIZE   0x20000000000ull    /* 2 TiB of VA */
static const U cs_zone_bases[] = {0x600000000000ull, 0x500000000000ull, 0x400000000000ull, 0x300000000000ull};
/* The program's own hint-less reservations (cuMemAddressReserve: PyTorch's expandable
 * segments, XLA) are carved from the zone too, without a driver call (the driver ignores
 * hints for small reservations); their cuMemAddressFree returns the range to the zone. */
#define CS_SMALL_ALIGN 512ull

typedef struct { U base, size; U handle; int refs; int open; int dev; } cs_slab;
typedef struct { U ptr, size; int slab; U handle; U rsize; } cs_alloc;

static pthread_mutex_t cs_pl_lock = PTHREAD_MUTEX_INITIALIZER;
static int cs_pl_on = -1;
static const char *cs_pl_step = "";        /* which VMM step failed, for the fallback note */
static unsigned cs_pl_fallbacks;            /* allocations left to the driver */
static U cs_zone, cs_zone_end;              /* the reserved allocation zone */
static U cs_pl_next;                         /* bump pointer over the zone */
typedef struct { U base, size; } cs_range;
static cs_range *cs_holes; static int cs_nholes, cs_capholes;   /* freed large ranges, reused first-fit */
static U cs_pl_gran;
static cs_slab *cs_slabs; static int cs_nslabs, cs_capslabs;
/* the slab small allocations go to, per device (index + 1; 0: none): a slab's memory lives on
 * one GPU and is accessible from it, so another device's allocations never share it */
#define CS_PL_DEVS 64
static int cs_cur_slab1[CS_PL_DEVS];
static cs_alloc *cs_allocs; static int cs_nallocs, cs_capallocs;
static cs_range *cs_resv; static int cs_nresv, cs_capresv;      /* program reservations in the zone */

typedef CUresult (*cs_f5)(U, U, U, U, U);
static CUresult cs_zone_take(U size, U align, U *at);
/* legacy IPC over placed memory (shim_placement_ipc.c) */
static void cs_ipc_forget(U handle);
static int cs_ipc_get(U *a, CUresult *res);
static int cs_ipc_open(const cs_fn *fn, U *a, CUresult *res);
static int cs_ipc_close(U *a, CUresult *res);
static int cs_pl_noshare;                   /* the driver refused shareable physical memory */

static int cs_placement_on(void) {
    if (cs_pl_on < 0) {
        const char *e = getenv("CUDASNAP_PLACEMENT");
        cs_pl_on = !(e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0));
    }
    return cs_pl_on;
}

/* CUmemAllocationProp: type PINNED, location DEVICE dev (32 bytes), exportable as a POSIX fd
 * (legacy IPC of placed memory, shim_placement_ipc.c) unless the driver refused that once */
static void cs_prop(unsigned char prop[32], int dev) {
    memset(prop, 0, 32);
    uint32_t v;
    v = 1; memcpy(prop + 0, &v, 4);     /* CU_MEM_ALLOCATION_TYPE_PINNED */
    v = cs_pl_noshare ? 0 : 1; memcpy(prop + 4, &v, 4);   /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    v = 1; memcpy(prop + 8, &v, 4);     /* CU_MEM_LOCATION_TYPE_DEVICE */
    memcpy(prop + 12, &dev, 4);
}

static int cs_cur_device(void) {
    int dev = 0;
    cs_fn2 g = CALLREAL(CS_ID_cuCtxGetDevice, cs_fn2);
    if (g) ((CUresult(*)(U))g)((U)&dev);
    return dev;
}

/* The devices that may reach memory of `dev`: itself, then every GPU that can access it as a
 * peer. Peer access (cuCtxEnablePeerAccess) does not reach VMM memory, cuMemSetAccess does: a
 * program's kernel reading a peer's cudaMalloc memory works under capture as it did without.
 * Asked once (called with cs_pl_lock held). */
#define CS_PL_MAXDEV 16
static int cs_peer_n = -1;
static unsigned char cs_peer_can[CS_PL_MAXDEV][CS_PL_MAXDEV];   /* [d][dev]: d can reach dev */
static int cs_access_list(int dev, int *out) {
    if (cs_peer_n < 0) {
        int n = 0;
        cs_fn2 count = CALLREAL(CS_ID_cuDeviceGetCount, cs_fn2);
        cs_fn3 can = CALLREAL(CS_ID_cuDeviceCanAccessPeer, cs_fn3);
        if (count && count((U)&n, 0) != 0) n = 0;
        if (n > CS_PL_MAXDEV) n = CS_PL_MAXDEV;
        for (int d = 0; d < n; d++)
            for (int e = 0; e < n; e++) {
                int c = 0;
                if (d != e && can && can((U)&c, (U)d, (U)e) != 0) c = 0;
                cs_peer_can[d][e] = (unsigned char)(d != e && c);
            }
        cs_peer_n = n;
    }
    int k = 0;
    out[k++] = dev;
    for (int d = 0; d < cs_peer_n; d++)
        if (d != dev && dev >= 0 && dev < CS_PL_MAXDEV && cs_peer_can[d][dev]) out[k++] = d;
    return k;
}

/* Map physical memory `h` at [at, at+size), readable and writable from `dev` and every GPU
 * that can reach it as a peer. 0 on success; on failure nothing stays mapped. */
static CUresult cs_map_handle(U at, U size, int dev, U h) {
    cs_f5 map = CALLREAL(CS_ID_cuMemMap, cs_f5);
    cs_fn4 access = CALLREAL(CS_ID_cuMemSetAccess, cs_fn4);
    cs_fn2 unmap = CALLREAL(CS_ID_cuMemUnmap, cs_fn2);
    if (!map || !access || !unmap) return 801;
    CUresult r;
    cs_pl_step = "cuMemMap";
    if ((r = map(at, size, 0, h, 0))) return r;
    int devs[CS_PL_MAXDEV + 1];
    int nd = cs_access_list(dev, devs);
    unsigned char desc[12 * (CS_PL_MAXDEV + 1)];
    uint32_t t = 1, fl = 3;   /* location DEVICE, READWRITE */
    for (int i = 0; i < nd; i++) {
        memcpy(desc + 12 * i, &t, 4); memcpy(desc + 12 * i + 4, &devs[i], 4); memcpy(desc + 12 * i + 8, &fl, 4);
    }
    cs_pl_step = "cuMemSetAccess";
    if ((r = access(at, size, (U)desc, (U)nd))) unmap(at, size);
    return r;
}

/* Map fresh physical memory at [at, at+size) inside the zone. 0 on success. */
static CUresult cs_map_at(U at, U size, int dev, U *handle_out) {
    cs_fn4 create = CALLREAL(CS_ID_cuMemCreate, cs_fn4);
    cs_fn2 release = CALLREAL(CS_ID_cuMemRelease, cs_fn2);
    cs_pl_step = "resolving the VMM entry points";
    if (!create || !release) return 801;
    unsigned char prop[32];
    cs_prop(prop, dev);
    U h = 0;
    CUresult r;
    cs_pl_step = "cuMemCreate";
    if ((r = create((U)&h, size, (U)prop, 0)) && !cs_pl_noshare && r != 2 /* out of memory */) {
        cs_pl_noshare = 1;                  /* not shareable here: plain memory from now on */
        cs_prop(prop, dev);
        r = create((U)&h, size, (U)prop, 0);
    }
    if (r) return r;
    if ((r = cs_map_handle(at, size, dev, h))) { ((CUresult(*)(U))release)(h); return r; }
    *handle_out = h;
    return 0;
}

static void cs_emit_region(U base, U size) {
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + 2 * cs_flen(8), CS_REC_REGION)) return;
    r.h->t_ns = cs_now();
    cs_put_val(&r, CS_F_HANDLE, base);
    cs_put_val(&r, CS_F_CODE, size);
    cs_publish(&r);
}

/* Reserve the allocation zone at one of the fixed bases. */
static CUresult cs_zone_reserve(void) {
    cs_f5 reserve = CALLREAL(CS_ID_cuMemAddressReserve, cs_f5);
    cs_fn2 afree = CALLREAL(CS_ID_cuMemAddressFree, cs_fn2);
    cs_pl_step = "cuMemAddressReserve of the placement zone";
    if (!reserve || !afree) return 801;
    for (unsigned i = 0; i < sizeof cs_zone_bases / sizeof cs_zone_bases[0]; i++) {
        U got = 0;
        CUresult r = reserve((U)&got, CS_ZONE_SIZE, cs_pl_gran, cs_zone_bases[i], 0);
        if (r) return r;
        if (got == cs_zone_bases[i]) {
            cs_zone = got; cs_zone_end = got + CS_ZONE_SIZE; cs_pl_next = got;
            cs_emit_region(got, CS_ZONE_SIZE);
            return 0;
        }
        afree(got, CS_ZONE_SIZE);
    }
    return 1;
}

static void cs_push_hole(U base, U size) {
    if (cs_nholes == cs_capholes) {
        int cap = cs_capholes ? cs_capholes * 2 : 256;
        cs_range *g = realloc(cs_holes, (size_t)cap * sizeof *g);
        if (!g) return;   /* the range is simply not reused */
        cs_holes = g; cs_capholes = cap;
    }
    cs_holes[cs_nholes++] = (cs_range){base, size};
}

static void cs_unmap_at(U base, U size, U h) {
    cs_ipc_forget(h);
    cs_fn2 unmap = CALLREAL(CS_ID_cuMemUnmap, cs_fn2);
    cs_fn2 release = CALLREAL(CS_ID_cuMemRelease, cs_fn2);
    if (unmap) unmap(base, size);
    if (release) ((CUresult(*)(U))release)(h);
    cs_push_hole(base, size);
}

/* A free range of `size` bytes in the zone, mapped with fresh physical memory. */
static CUresult cs_region_map(U size, int dev, U *base, U *handle) {
    U at = 0;
    CUresult r = cs_zone_take(size, cs_pl_gran, &at);
    if (r) return r;
    r = cs_map_at(at, size, dev, handle);
    if (r) { cs_push_hole(at, size); return r; }
    *base = at;
    return 0;
}

static int cs_push_alloc(cs_alloc a) {
    if (cs_nallocs == cs_capallocs) {
        int cap = cs_capallocs ? cs_capallocs * 2 : 1024;
        cs_alloc *g = realloc(cs_allocs, (size_t)cap * sizeof *g);
        if (!g) return -1;
        cs_allocs = g; cs_capallocs = cap;
    }
    cs_allocs[cs_nallocs++] = a;
    return 0;
}

static int cs_find_alloc(U p, int containing) {
    for (int i = cs_nallocs - 1; i >= 0; i--) {
        if (cs_allocs[i].ptr == p) return i;
        if (containing && p > cs_allocs[i].ptr && p < cs_allocs[i].ptr + cs_allocs[i].size) return i;
    }
    return -1;
}

static CUresult cs_ensure_zone(int dev) {
    if (!cs_pl_gran) {
        cs_fn3 gg = CALLREAL(CS_ID_cuMemGetAllocationGranularity, cs_fn3);
        unsigned char prop[32];
        cs_prop(prop, dev);
        size_t g = 0;
        cs_pl_step = "cuMemGetAllocationGranularity";
        if (!gg || gg((U)&g, (U)prop, 0) != 0 || !g) return 801;
        cs_pl_gran = g;
    }
    return cs_zone ? 0 : cs_zone_reserve();
}

/* A range of `size` bytes aligned to `align` from the zone (a freed one of that size first). */
static CUresult cs_zone_take(U size, U align, U *at) {
    for (int i = 0; i < cs_nholes; i++)
        if (cs_holes[i].size == size && (cs_holes[i].base & (align - 1)) == 0) {
            *at = cs_holes[i].base;
            cs_holes[i] = cs_holes[--cs_nholes];
            return 0;
        }
    U want = (cs_pl_next + align - 1) & ~(align - 1);
    if (want + size > cs_zone_end) return 2;   /* zone exhausted: out of memory */
    cs_pl_next = want + size;
    *at = want;
    return 0;
}

static CUresult cs_place_alloc(U *dptr, U bytes) {
    int dev = cs_cur_device();
    CUresult zr = cs_ensure_zone(dev);
    if (zr) return zr;
    if (bytes >= cs_pl_gran / 2) {
        U size = (bytes + cs_pl_gran - 1) & ~(cs_pl_gran - 1), base, h;
        CUresult r = cs_region_map(size, dev, &base, &h);
        if (r) return r;
        cs_alloc a = {base, bytes, -1, h, size};
        if (cs_push_alloc(a)) { cs_unmap_at(base, size, h); return 2; }
        *dptr = base;
        return 0;
    }
    U need = (bytes + CS_SMALL_ALIGN - 1) & ~(CS_SMALL_ALIGN - 1);
    int *cur = &cs_cur_slab1[(unsigned)dev % CS_PL_DEVS];
    cs_slab *s = *cur > 0 ? &cs_slabs[*cur - 1] : NULL;
    if (!s || s->open + need > s->size) {
        if (s) { s->open = (int)s->size; if (s->refs == 0) { cs_unmap_at(s->base, s->size, s->handle); s->size = 0; } }
        if (cs_nslabs == cs_capslabs) {
            int cap = cs_capslabs ? cs_capslabs * 2 : 64;
            cs_slab *g = realloc(cs_slabs, (size_t)cap * sizeof *g);
            if (!g) return 2;
            cs_slabs = g; cs_capslabs = cap;
        }
        cs_slab n = {0, cs_pl_gran, 0, 0, 0, dev};
        CUresult r = cs_region_map(n.size, dev, &n.base, &n.handle);
        if (r) return r;
        cs_slabs[cs_nslabs] = n;
        *cur = ++cs_nslabs;
        s = &cs_slabs[*cur - 1];
    }
    U p = s->base + (U)s->open;
    s->open += (int)need;
    s->refs++;
    cs_alloc a = {p, bytes, *cur - 1, 0, need};
    if (cs_push_alloc(a)) { s->refs--; return 2; }
    *dptr = p;
    return 0;
}

static int cs_place_free(U p, CUresult *res) {
    int i = cs_find_alloc(p, 0);
    if (i < 0) return 0;
    cs_alloc a = cs_allocs[i];
    cs_allocs[i] = cs_allocs[--cs_nallocs];
    if (a.slab < 0) {
        cs_unmap_at(a.ptr, a.rsize, a.handle);
    } else {
        cs_slab *s = &cs_slabs[a.slab];
        if (--s->refs == 0 && a.slab != cs_cur_slab1[(unsigned)s->dev % CS_PL_DEVS] - 1 && s->size) {
            cs_unmap_at(s->base, s->size, s->handle);
            s->size = 0;
        }
    }
    *res = 0;
    return 1;
}

/* Replace the real call for the allocation family; returns 1 when handled. */
static int cs_hook_replace(const cs_fn *fn, U *a, CUresult *res) {
    if (fn->hook != CS_H_PLACE || !cs_placement_on()) return 0;
    const char *n = fn->name;
    int handled = 0;
    if (strcmp(n, "cuMemAlloc_v2") == 0) {
        if (!a[0] || !a[1]) return 0;
        pthread_mutex_lock(&cs_pl_lock);
        U p = 0;
        CUresult r = cs_place_alloc(&p, a[1]);
        pthread_mutex_unlock(&cs_pl_lock);
        if (r) {
            /* Placement never makes an allocation fail that the driver would make: whatever
             * went wrong (no VMM, no context, VMM out of memory, zone exhausted), the driver
             * places this one itself. Said for the first few, then counted at exit. */
            unsigned k = __atomic_fetch_add(&cs_pl_fallbacks, 1, __ATOMIC_RELAXED);
            if (k < 4) {
                char msg[256];
                snprintf(msg, sizeof msg, "placement: cuMemAlloc_v2(%llu) left to the driver: %s returned %d",
                         (unsigned long long)a[1], cs_pl_step, (int)r);
                cs_note(msg);
            }
            return 0;
        }
        *(U *)a[0] = p;
        *res = 0;
        return 1;
    }
    if (strcmp(n, "cuMemFree_v2") == 0) {
        pthread_mutex_lock(&cs_pl_lock);
        handled = cs_place_free(a[0], res);
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    if (strcmp(n, "cuMemGetAddressRange_v2") == 0) {
        pthread_mutex_lock(&cs_pl_lock);
        int i = cs_find_alloc(a[2], 1);
        if (i >= 0) {
            if (a[0]) *(U *)a[0] = cs_allocs[i].ptr;
            if (a[1]) *(U *)a[1] = cs_allocs[i].size;
            *res = 0;
            handled = 1;
        }
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    if (strcmp(n, "cuMemAddressReserve") == 0 && a[3] == 0 && a[0] && a[1]) {
        /* a reservation the driver would place: carve it from the zone */
        pthread_mutex_lock(&cs_pl_lock);
        if (cs_ensure_zone(cs_cur_device()) == 0 && (a[1] & (cs_pl_gran - 1)) == 0) {
            U align = a[2] > cs_pl_gran ? a[2] : cs_pl_gran, at = 0;
            if ((align & (align - 1)) == 0 && cs_zone_take(a[1], align, &at) == 0) {
                if (cs_nresv == cs_capresv) {
                    int cap = cs_capresv ? cs_capresv * 2 : 64;
                    cs_range *g = realloc(cs_resv, (size_t)cap * sizeof *g);
                    if (g) { cs_resv = g; cs_capresv = cap; }
                }
                if (cs_nresv < cs_capresv) {
                    cs_resv[cs_nresv++] = (cs_range){at, a[1]};
                    *(U *)a[0] = at;
                    *res = 0;
                    handled = 1;
                } else {
                    cs_push_hole(at, a[1]);
                }
            }
        }
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    if (strcmp(n, "cuIpcGetMemHandle") == 0) {
        pthread_mutex_lock(&cs_pl_lock);
        handled = cs_ipc_get(a, res);
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    if (strncmp(n, "cuIpcOpenMemHandle", 18) == 0) return cs_ipc_open(fn, a, res);
    if (strcmp(n, "cuIpcCloseMemHandle") == 0) {
        pthread_mutex_lock(&cs_pl_lock);
        handled = cs_ipc_close(a, res);
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    if (strcmp(n, "cuMemAddressFree") == 0) {
        pthread_mutex_lock(&cs_pl_lock);
        for (int i = 0; i < cs_nresv; i++)
            if (cs_resv[i].base == a[0]) {
                cs_push_hole(cs_resv[i].base, cs_resv[i].size);
                cs_resv[i] = cs_resv[--cs_nresv];
                *res = 0;
                handled = 1;
                break;
            }
        pthread_mutex_unlock(&cs_pl_lock);
        return handled;
    }
    return 0;
}

/* After a pointer-attribute query: a packed allocation's range is its own, not its slab's
 * (what the driver reports for a cuMemAlloc of the program's, so capture changes nothing). */
static void cs_place_after(const cs_fn *fn, const U *a, CUresult res) {
    enum { RANGE_START = 11, RANGE_SIZE = 12 };
    if (res != 0 || !cs_placement_on() || !cs_nallocs) return;
    const char *n = fn->name;
    U ptr;
    unsigned num;
    const uint32_t *attrs;
    void *const *data;
    uint32_t one;
    void *one_data;
    if (strcmp(n, "cuPointerGetAttribute") == 0) {
        one = (uint32_t)a[1]; one_data = (void *)a[0];
        num = 1; attrs = &one; data = &one_data; ptr = a[2];
    } else if (strcmp(n, "cuPointerGetAttributes") == 0) {
        num = (unsigned)a[0]; attrs = (const uint32_t *)a[1]; data = (void *const *)a[2]; ptr = a[3];
        if (!attrs || !data) return;
    } else {
        return;
    }
    for (unsigned i = 0; i < num; i++) {
        if ((attrs[i] != RANGE_START && attrs[i] != RANGE_SIZE) || !data[i]) continue;
        pthread_mutex_lock(&cs_pl_lock);
        int k = cs_find_alloc(ptr, 1);
        cs_alloc al = k >= 0 ? cs_allocs[k] : (cs_alloc){0};
        pthread_mutex_unlock(&cs_pl_lock);
        if (k < 0 || al.slab < 0) continue;     /* not packed: the driver's answer is exact */
        *(U *)data[i] = attrs[i] == RANGE_START ? al.ptr : al.size;
    }
}

/* At exit: how many allocations placement left to the driver, when more than were named. */
static void cs_place_exit_note(void) {
    unsigned k = __atomic_load_n(&cs_pl_fallbacks, __ATOMIC_RELAXED);
    if (k > 4) {
        char msg[160];
        snprintf(msg, sizeof msg, "placement: %u cuMemAlloc_v2 calls left to the driver in all", k);
        cs_note(msg);
    }
}
