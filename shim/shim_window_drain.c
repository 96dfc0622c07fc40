/* State dumps that pause the program only for device-to-device copies. Included by
 * shim_window.c.
 *
 * At a window start or checkpoint, each range's changed chunks are copied into spare device
 * memory (cuMemAlloc with interception paused, ~1 TB/s), then the program goes on while a
 * drain thread copies the spare memory to the host (cuMemcpyDtoHAsync on a non-blocking
 * stream of its own, through the pinned staging buffer) and sends it through the ring; it
 * writes the state's end record last (the recorder holds the program's records meanwhile,
 * capture/window.py). The next dump, a window's close and the program's exit wait for the
 * drain (the wait is reported). The spare memory is freed once drained. It is taken only
 * from free device memory above a headroom of max(1 GiB, 10% of the device), so the
 * program keeps room to allocate; CUDASNAP_WIN_SPARE=MiB caps it (0 or off: always copy
 * through the host while the program waits, the former path, also used when the spare
 * memory can't be had). */

typedef struct { U dst, src, len; int ri; } cs_dpiece;       /* program address, spare address */
typedef struct {
    U ptr, size, ctx, nch, spare;
    U *hnow;                    /* GPU hashes at the dump (gpu), committed once drained */
    unsigned char *dig;         /* chunk digests: the previous ones, then the sent ones */
    int gpu, cmp, lost;
} cs_drange;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, busy, go;
    int on;                     /* -1 not read yet, 0 off, 1 on */
    U cap, budget, t0;          /* spare cap from the environment; what this dump may take */
    cs_dpiece *p; int np, capp;
    cs_drange *r; int nr, capr;
    const char *why; U bytes, nranges;
} cs_dq = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, -1, 0, 0, 0, NULL, 0, 0, NULL, 0, 0,
           NULL, 0, 0};

static int cs_dq_id(const char *name) {
    int id = cs_lookup(name);
    return id >= 0 && cs_resolve(id) ? id : -1;
}

/* A dump starts: how much spare device memory it may use. */
static void cs_drain_begin(void) {
    cs_dq.np = cs_dq.nr = 0;
    cs_dq.budget = 0;
    if (cs_dq.on < 0) {
        const char *e = getenv("CUDASNAP_WIN_SPARE");
        cs_dq.on = !(e && (strcmp(e, "off") == 0 || strcmp(e, "0") == 0));
        cs_dq.cap = e && atoll(e) > 0 ? (U)atoll(e) << 20 : ~0ull;
    }
    int gi = cs_dq_id("cuMemGetInfo_v2");
    size_t fr = 0, tot = 0;
    if (!cs_dq.on || gi < 0 || ((cs_fn2)cs_resolve(gi))((U)&fr, (U)&tot) != 0) return;
    U head = tot / 10 > (1ull << 30) ? tot / 10 : (1ull << 30);
    cs_dq.budget = fr > head ? fr - head : 0;
    if (cs_dq.budget > cs_dq.cap) cs_dq.budget = cs_dq.cap;
}

static int cs_dq_grow(void **p, int *cap, int n, size_t sz) {
    if (n < *cap) return 0;
    int nc = *cap ? 2 * *cap : 64;
    void *g = realloc(*p, (size_t)nc * sz);
    if (!g) return -1;
    *p = g; *cap = nc;
    return 0;
}

/* One range during the pause: references for unchanged chunks now, changed ones copied
 * into spare memory for the drain. Returns 0 when the range is left to the copy through
 * the host (small, nothing changed, no spare memory); 1 when taken (hnow is then the
 * drain's). */
/* The chunk at `off`, when unchanged since the previous state, goes out as a reference to
 * that state's chunk: its length, or 0 when it changed (or no digests can be trusted). */
static U cs_win_ref_unchanged(cs_wrange *w, const U *hnow, int refs, U off) {
    U c = off / CS_CHUNK;
    if (!refs || hnow[c] != w->hprev[c]) return 0;
    U len = w->size - off < CS_CHUNK ? w->size - off : CS_CHUNK;
    cs_win_emit_h2d(w->ptr + off, cs_blob_ref(w->dprev + 16 * c, len), len);
    cs_dump_stats[1] += len;
    return len;
}

static int cs_drain_plan(cs_wrange *w, U *hnow, int gpu, int refs) {
    static int id_alloc = -2, id_d2d;
    if (id_alloc == -2) { id_alloc = cs_dq_id("cuMemAlloc_v2"); id_d2d = cs_dq_id("cuMemcpyDtoD_v2"); }
    if (!cs_dq.budget || w->size < (1u << 20) || id_alloc < 0 || id_d2d < 0) return 0;
    U changed = 0;
    for (U off = 0; off < w->size; off += CS_CHUNK) {
        U len = w->size - off < CS_CHUNK ? w->size - off : CS_CHUNK;
        if (!(refs && hnow[off / CS_CHUNK] == w->hprev[off / CS_CHUNK])) changed += len;
    }
    if (!changed || changed > cs_dq.budget) return 0;
    if (cs_dq_grow((void **)&cs_dq.r, &cs_dq.capr, cs_dq.nr, sizeof *cs_dq.r)) return 0;
    U spare = 0;
    if (((cs_fn2)cs_resolve(id_alloc))((U)&spare, changed) != 0) { cs_dq.budget = 0; return 0; }
    cs_dq.budget -= changed;
    cs_drange *r = &cs_dq.r[cs_dq.nr];
    *r = (cs_drange){w->ptr, w->size, w->ctx, w->nch, spare, hnow, NULL, gpu,
                     w->nch && !gpu && w->dvalid && cs_hash_mode == 0, 0};
    if (w->nch && (r->dig = malloc(w->nch * 16))) memcpy(r->dig, w->dprev, w->nch * 16);
    if (w->nch && !r->dig) r->lost = 1;
    U so = 0;
    cs_fn3 d2d = (cs_fn3)cs_resolve(id_d2d);
    for (U off = 0; off < w->size;) {
        U len = cs_win_ref_unchanged(w, hnow, refs, off);
        if (len) {
            off += len;
            continue;
        }
        U run = 0;
        while (off + run < w->size && !(run && refs && hnow[(off + run) / CS_CHUNK] == w->hprev[(off + run) / CS_CHUNK]))
            run += w->size - (off + run) < CS_CHUNK ? w->size - (off + run) : CS_CHUNK;
        if (d2d(spare + so, w->ptr + off, run) != 0) {
            r->lost = 1;
            cs_note("window state: a live range could not be copied to spare device memory: the state is partial");
        }
        else if (cs_dq_grow((void **)&cs_dq.p, &cs_dq.capp, cs_dq.np, sizeof *cs_dq.p) == 0)
            cs_dq.p[cs_dq.np++] = (cs_dpiece){w->ptr + off, spare + so, run, cs_dq.nr};
        else r->lost = 1;
        so += run;
        off += run;
    }
    cs_dq.nr++;
    cs_dump_stats[7] += changed;
    return 1;
}

/* After the drain: the ranges still live with the same extent take the new hashes and digests. */
static void cs_drain_commit(void) {
    pthread_mutex_lock(&cs_wr_lock);
    for (int k = 0; k < cs_dq.nr; k++) {
        cs_drange *r = &cs_dq.r[k];
        for (int i = 0; i < cs_nwr && r->nch; i++) {
            cs_wrange *w = &cs_wr[i];
            if (w->ptr != r->ptr || w->size != r->size || w->nch != r->nch) continue;
            if (r->dig) memcpy(w->dprev, r->dig, r->nch * 16);
            w->dvalid = r->dig && !r->lost;
            if (r->gpu) { memcpy(w->hprev, r->hnow, r->nch * 8); w->hvalid = 1; } else w->hvalid = 0;
            break;
        }
        free(r->hnow); free(r->dig);
        r->hnow = NULL; r->dig = NULL;
    }
    pthread_mutex_unlock(&cs_wr_lock);
}

static void cs_drain_run(void) {
    static int id_cur = -2, id_sc, id_sd, id_d2h, id_ss, id_free, id_mode;
    if (id_cur == -2) {
        id_cur = cs_dq_id("cuCtxSetCurrent"); id_sc = cs_dq_id("cuStreamCreate");
        id_sd = cs_dq_id("cuStreamDestroy_v2"); id_d2h = cs_dq_id("cuMemcpyDtoHAsync_v2");
        id_ss = cs_dq_id("cuStreamSynchronize"); id_free = cs_dq_id("cuMemFree_v2");
        id_mode = cs_dq_id("cuThreadExchangeStreamCaptureMode");
    }
    unsigned failed = 0;
    U stream = 0, sctx = 0;
    if (id_mode >= 0) { int m = 2; ((cs_fn1)cs_resolve(id_mode))((U)&m); }   /* relaxed: a capture elsewhere can't refuse us */
    for (int i = 0; i < cs_dq.np; i++) {
        cs_dpiece *p = &cs_dq.p[i];
        cs_drange *r = &cs_dq.r[p->ri];
        if (r->ctx != sctx || !stream) {
            if (stream && id_sd >= 0) ((cs_fn1)cs_resolve(id_sd))(stream);
            stream = 0;
            if (id_cur >= 0) ((cs_fn1)cs_resolve(id_cur))(r->ctx);
            if (id_sc >= 0) ((cs_fn2)cs_resolve(id_sc))((U)&stream, 1);   /* CU_STREAM_NON_BLOCKING */
            sctx = r->ctx;
        }
        for (U o = 0; o < p->len; o += CS_WSTAGE) {
            U n = p->len - o < CS_WSTAGE ? p->len - o : CS_WSTAGE;
            typedef CUresult (*d2h_t)(U, U, U, U);
            if (!stream || id_d2h < 0 || ((d2h_t)cs_resolve(id_d2h))((U)cs_wstage, p->src + o, n, stream) != 0
                || ((cs_fn1)cs_resolve(id_ss))(stream) != 0) {
                r->lost = 1; failed++;
                continue;
            }
            U at = p->dst + o - r->ptr;
            if (cs_state_send(p->dst + o, cs_wstage, n, r->dig ? r->dig + 16 * (at / CS_CHUNK) : NULL, r->cmp)) r->lost = 1;
        }
    }
    if (stream && id_sd >= 0) ((cs_fn1)cs_resolve(id_sd))(stream);
    for (int k = 0; k < cs_dq.nr; k++) {
        if (id_cur >= 0) ((cs_fn1)cs_resolve(id_cur))(cs_dq.r[k].ctx);
        if (id_free >= 0) ((cs_fn1)cs_resolve(id_free))(cs_dq.r[k].spare);
    }
    if (id_cur >= 0) ((cs_fn1)cs_resolve(id_cur))(0);
    cs_drain_commit();
    cs_dq.np = cs_dq.nr = 0;
    if (failed) cs_note("window state: spare device memory could not be read back: the state is partial");
    cs_dump_stats[4] = cs_mono() - cs_dq.t0;
    cs_win_record(CS_WOP_STATE, cs_dq.why, cs_dq.bytes, cs_dq.nranges);
}

static void *cs_drainer(void *arg) {
    (void)arg;
    cs_patient = 1;
    cs_depth = 1;
    pthread_mutex_lock(&cs_dq.mu);
    for (;;) {
        while (!cs_dq.go) pthread_cond_wait(&cs_dq.cv, &cs_dq.mu);
        cs_dq.go = 0;
        pthread_mutex_unlock(&cs_dq.mu);
        cs_drain_run();
        pthread_mutex_lock(&cs_dq.mu);
        cs_dq.busy = 0;
        pthread_cond_broadcast(&cs_dq.cv);
    }
    return NULL;
}

static void cs_drain_atfork_child(void) {
    pthread_mutex_init(&cs_dq.mu, NULL);
    pthread_cond_init(&cs_dq.cv, NULL);
    cs_dq.started = cs_dq.busy = cs_dq.go = 0;
    cs_dq.np = cs_dq.nr = 0;
}

/* End of the pause: hand the spare memory to the drain thread, which writes the state's end
 * record. Returns 0 when nothing went to spare memory (the caller writes the end record). */
static int cs_drain_launch(const char *why, U bytes, U nranges, U t0) {
    if (!cs_dq.nr) return 0;
    pthread_mutex_lock(&cs_dq.mu);
    if (!cs_dq.started) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);     /* signals stay the program's */
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, cs_drainer, NULL) == 0) {
            pthread_setname_np(t, "cudasnap-drain");
            cs_dq.started = 1;
            pthread_atfork(NULL, NULL, cs_drain_atfork_child);
        }
        pthread_attr_destroy(&at);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (!cs_dq.started) {                              /* no thread: drain here, paused */
        pthread_mutex_unlock(&cs_dq.mu);
        cs_dq.why = why; cs_dq.bytes = bytes; cs_dq.nranges = nranges; cs_dq.t0 = t0;
        int was = cs_patient;
        cs_patient = 1;
        cs_drain_run();
        cs_patient = was;
        return 1;
    }
    cs_dq.why = why; cs_dq.bytes = bytes; cs_dq.nranges = nranges; cs_dq.t0 = t0;
    cs_dq.busy = 1; cs_dq.go = 1;
    pthread_cond_broadcast(&cs_dq.cv);
    pthread_mutex_unlock(&cs_dq.mu);
    return 1;
}

/* Wait for the previous dump's drain; returns the ns waited. */
static U cs_drain_wait(void) {
    if (!cs_dq.started) return 0;
    U t0 = cs_mono();
    pthread_mutex_lock(&cs_dq.mu);
    while (cs_dq.busy) pthread_cond_wait(&cs_dq.cv, &cs_dq.mu);
    pthread_mutex_unlock(&cs_dq.mu);
    return cs_mono() - t0;
}
