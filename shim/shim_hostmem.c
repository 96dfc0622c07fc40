/* shim_hostmem.c -- managed memory and pinned host memory mapped for the device, which kernels
 * read and the host writes without a copy call (included by shim_core.c).
 *
 * A kernel reaches managed memory through a pointer among its arguments, and what the host
 * wrote there never passes through an API call. So at a launch whose arguments point into a
 * managed allocation, the allocation's bytes go into the snapshot beside the launch: the first
 * time, and again after each synchronizing call since the last time (the host writes managed
 * memory when the device is done with it). Before such an allocation is freed (or unregistered),
 * the device is synchronized (as the free itself does) and its final bytes go in as a result
 * the replay verifies. Programs without either pay one load of cs_hm_n per call. Pinned memory
 * counts only when mapped for the device (DEVICEMAP), as zero-copy programs ask for it. */

#define CS_HM_MAX 4096              /* live managed allocations tracked */
#define CS_HM_PER_LAUNCH 8          /* allocations recorded at one launch */
#define CS_HM_WORDS 256             /* argument words looked at per launch */

typedef struct { U base, size; uint64_t epoch; } cs_hm_t;
static cs_hm_t cs_hm[CS_HM_MAX];
static int cs_hm_n;                                   /* read unlocked: 0 = nothing to look for */
static uint64_t cs_hm_epoch = 1;                      /* synchronizing calls returned (+1) */
static pthread_mutex_t cs_hm_lock = PTHREAD_MUTEX_INITIALIZER;

static void cs_hm_add(U base, U size) {
    if (!base || !size) return;
    pthread_mutex_lock(&cs_hm_lock);
    if (cs_hm_n < CS_HM_MAX) cs_hm[cs_hm_n++] = (cs_hm_t){base, size, 0};
    else cs_note("more than 4096 live managed allocations: the later ones' host-written bytes are not captured");
    pthread_mutex_unlock(&cs_hm_lock);
}

static int cs_hm_find_locked(U p) {
    for (int i = 0; i < cs_hm_n; i++)
        if (p - cs_hm[i].base < cs_hm[i].size) return i;
    return -1;
}

/* A window opens or a checkpoint is taken: what the snapshot holds starts here, so each
 * allocation is recorded again at the next launch that reaches it. */
static void cs_hm_forget(void) {
    pthread_mutex_lock(&cs_hm_lock);
    for (int i = 0; i < cs_hm_n; i++) cs_hm[i].epoch = 0;
    pthread_mutex_unlock(&cs_hm_lock);
}

/* A call returned: after a synchronizing one the host may have written managed memory. */
static void cs_hm_tick(const cs_fn *fn, CUresult res) {
    if (res == 0 && fn->host_sync)              /* the API description's "host_sync" */
        __atomic_add_fetch(&cs_hm_epoch, 1, __ATOMIC_RELAXED);
}

/* Allocations above CUDASNAP_HOSTMEM_MAX_MB (64 by default) are left out: a caching pool in
 * managed memory would be copied whole at every launch after a synchronization. */
static U cs_hm_cap(void) {
    static U cap;
    if (!cap) {
        const char *e = getenv("CUDASNAP_HOSTMEM_MAX_MB");
        U mb = e && *e ? (U)strtoull(e, NULL, 10) : 64;
        cap = mb ? mb << 20 : 1;
    }
    return cap;
}

/* The managed allocations a launch's arguments point into whose bytes may have changed since
 * they were last recorded, streamed as blobs: out[3 * i] = base, serial, size. Arguments come
 * packed (src, n bytes) or as kernelParams with their (offset, size) layout. Returns the count. */
static int cs_hm_launch(const void *src, uint32_t n, void *const *kp, const uint32_t *off_size, uint32_t nargs,
                        U *out) {
    U words[CS_HM_WORDS];
    int nw = 0;
    if (src) {
        for (uint32_t o = 0; o + 8 <= n && nw < CS_HM_WORDS; o += 8) memcpy(&words[nw++], (const char *)src + o, 8);
    } else if (kp && off_size) {
        for (uint32_t i = 0; i < nargs && nw < CS_HM_WORDS; i++)
            for (uint32_t o = 0; kp[i] && o + 8 <= off_size[2 * i + 1] && nw < CS_HM_WORDS; o += 8)
                memcpy(&words[nw++], (const char *)kp[i] + o, 8);
    }
    U cap = cs_hm_cap();
    int hits = 0, big = 0;
    pthread_mutex_lock(&cs_hm_lock);
    uint64_t now = __atomic_load_n(&cs_hm_epoch, __ATOMIC_RELAXED);
    for (int w = 0; w < nw && hits < CS_HM_PER_LAUNCH; w++) {
        int i = cs_hm_find_locked(words[w]);
        if (i < 0 || cs_hm[i].epoch == now) continue;
        cs_hm[i].epoch = now;
        if (cs_hm[i].size > cap) { big = 1; continue; }
        out[3 * hits] = cs_hm[i].base;
        out[3 * hits + 2] = cs_hm[i].size;
        hits++;
    }
    pthread_mutex_unlock(&cs_hm_lock);
    static int told;
    if (big && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        cs_note("limitation: a managed allocation above CUDASNAP_HOSTMEM_MAX_MB (64 MiB by default) reached by a "
                "launch is not recorded with it: what the host writes there in place is not captured");
    for (int h = 0; h < hits; h++) out[3 * h + 1] = cs_blob((const void *)out[3 * h], out[3 * h + 2]);
    return hits;
}

/* Before cuMemFree of a managed allocation: its final bytes (after the device is done with
 * them), streamed as a blob and forgotten. Returns the serial, 0 when p is not managed. */
static uint64_t cs_hm_free(U p, uint64_t *size) {
    pthread_mutex_lock(&cs_hm_lock);
    int i = cs_hm_find_locked(p);
    cs_hm_t m = i >= 0 ? cs_hm[i] : (cs_hm_t){0, 0, 0};
    if (i >= 0) cs_hm[i] = cs_hm[--cs_hm_n];
    pthread_mutex_unlock(&cs_hm_lock);
    if (i < 0 || m.base != p || m.size > cs_hm_cap()) return 0;      /* a large one: no copy at its free either */
    void *sync = CS_ID_cuCtxSynchronize >= 0 ? cs_resolve(CS_ID_cuCtxSynchronize) : NULL;
    if (!sync || ((CUresult (*)(void))sync)() != 0) return 0;
    *size = m.size;
    return cs_blob((const void *)m.base, m.size);
}
