/* Capture windows and flight-recorder checkpoints (formats/SCHEMA.md, "Windows").
 *
 * With CUDASNAP_WINDOW set, the shim keeps the live device memory ranges (cuMemAlloc*,
 * pool/async allocations, VMM mappings, managed memory) and opens windows. At a window
 * start (or a flight-recorder checkpoint) it writes the contents of every live range as
 * ordinary cuMemcpyHtoD_v2 records flagged as state (PRE aux = 2), copied D2H with
 * interception paused, after synchronizing each context; other threads wait at the entry
 * of their next call meanwhile. Outside windows the copies' payloads are not sent (the
 * recorder drops those calls; the next window's state holds the memory). The recorder
 * keeps the calls that create state. Included by shim_core.c.
 *
 * Modes (CUDASNAP_WINDOW): launches (CUDASNAP_WIN_A..B, launch numbers from 0), profiler,
 * nvtx (CUDASNAP_WIN_NAME, K-th range CUDASNAP_WIN_K, 0 every), kernel (regex
 * CUDASNAP_WIN_NAME, K-th match, CUDASNAP_WIN_CONTEXT launches after it), signal and time
 * (the recorder bumps the ring header's win_req: each bump opens or closes), flight (each
 * bump is a checkpoint; everything is recorded). */
#include <regex.h>

typedef CUresult (*cs_fn0)(void);

enum { CS_W_OFF, CS_W_LAUNCHES, CS_W_PROFILER, CS_W_NVTX, CS_W_KERNEL, CS_W_SIGNAL, CS_W_TIME, CS_W_FLIGHT };
enum { CS_WOP_OPEN = 1, CS_WOP_CLOSE = 2, CS_WOP_STATE = 3, CS_WOP_CHECKPOINT = 4, CS_WOP_ENDSTATE = 5 };
enum { CS_WR_NONE, CS_WR_ALLOC, CS_WR_PITCH, CS_WR_FREE, CS_WR_MAP, CS_WR_UNMAP, CS_WR_CAPBEGIN, CS_WR_CAPEND,
       CS_WR_PROFSTART, CS_WR_PROFSTOP, CS_WR_GLOBAL };

static int cs_win_mode;                  /* CS_W_*, read when the ring opens */
static int cs_win_open;                  /* inside a window: payloads are recorded */
static int cs_win_skip;                  /* window mode, outside a window: copies' payloads not sent */
static uint64_t cs_win_a, cs_win_b, cs_win_k, cs_win_ctxn;
static char cs_win_name[512];
static regex_t cs_win_rx;
static uint64_t cs_win_launches;         /* launches seen (atomic) */
static uint64_t cs_win_matches;          /* nvtx ranges / kernels matched */
static uint64_t cs_win_close_at = ~0ull; /* kernel mode: close after this launch */
/* A stream capture in progress forbids the synchronous work of a state dump (it would
 * invalidate the program's capture): an open or close that falls inside one waits for the
 * first call after it. */
static int cs_win_defer_open;            /* kernel mode: a match inside a capture */
static int cs_win_launches_done;         /* launches mode: the window has closed */
static int cs_win_deferred_noted;
static int cs_win_late_open;             /* launches mode: the deferred open was taken */
static int cs_win_close_wait;            /* a close reached inside a capture */
static uint32_t cs_win_serial;           /* windows / checkpoints opened */
static uint32_t cs_win_req_seen;         /* recorder requests handled */
static int cs_win_pending;               /* 1 open, 2 close: asked by an NVTX callback */
static uint64_t cs_win_nvtx_id;          /* the open NVTX range: level+1 (push) or id (start) */
static int cs_win_nvtx_push;
static int cs_win_capturing;             /* stream captures in progress: no sync possible */
static uint64_t cs_win_dumper;           /* thread writing the state (others wait), or 0 */
static uint64_t cs_win_inflight;         /* threads inside a recorded call */
static unsigned char cs_win_role[CS_NFN];
static int cs_win_id_h2d = -1, cs_win_id_sync = -1, cs_win_id_d2h = -1, cs_win_id_hostalloc = -1,
           cs_win_id_getcur = -1, cs_win_id_push = -1, cs_win_id_pop = -1;

/* a live range; hprev/dprev: per 4 MiB chunk, its hash and digest at the last state dump */
typedef struct { U ptr, size, ctx; U *hprev; unsigned char *dprev; U nch; int hvalid, dvalid; } cs_wrange;
static cs_wrange *cs_wr; static int cs_nwr, cs_capwr;
static pthread_mutex_t cs_wr_lock = PTHREAD_MUTEX_INITIALIZER;
#define CS_WSTAGE (64ull << 20)
static void *cs_wstage; static int cs_wstage_pinned;

static void cs_job_init(void);             /* shim_window_jobcut.c */
static unsigned cs_fn_flags(U f);          /* a launched function's name flags (below) */
static int cs_job_holding;                 /* a job's rendezvous holds the other threads (jobcut.c) */

static uint64_t cs_env_u64(const char *k, uint64_t dflt) {
    const char *e = getenv(k);
    return e && *e ? strtoull(e, NULL, 10) : dflt;
}

static void cs_win_init(void) {
    const char *m = getenv("CUDASNAP_WINDOW");
    if (!m || !*m) return;
    static const char *names[] = {"", "launches", "profiler", "nvtx", "kernel", "signal", "time", "flight"};
    int mode = 0;
    for (int i = 1; i < 8; i++) if (strcmp(m, names[i]) == 0) mode = i;
    if (!mode) return;
    cs_win_a = cs_env_u64("CUDASNAP_WIN_A", 0);
    cs_win_b = cs_env_u64("CUDASNAP_WIN_B", ~0ull);
    cs_win_k = cs_env_u64("CUDASNAP_WIN_K", 0);
    cs_win_ctxn = cs_env_u64("CUDASNAP_WIN_CONTEXT", 0);
    const char *nm = getenv("CUDASNAP_WIN_NAME");
    snprintf(cs_win_name, sizeof cs_win_name, "%s", nm ? nm : "");
    if (mode == CS_W_KERNEL && regcomp(&cs_win_rx, cs_win_name, REG_EXTENDED | REG_NOSUB) != 0) {
        cs_note("window: the kernel regex does not compile: no window");
        return;
    }
    static const struct { const char *base; int role; } roles[] = {
        {"cuMemAlloc", CS_WR_ALLOC}, {"cuMemAllocAsync", CS_WR_ALLOC}, {"cuMemAllocFromPoolAsync", CS_WR_ALLOC},
        {"cuMemAllocManaged", CS_WR_ALLOC}, {"cuMemAllocPitch", CS_WR_PITCH}, {"cuMemFree", CS_WR_FREE},
        {"cuMemFreeAsync", CS_WR_FREE}, {"cuMemMap", CS_WR_MAP}, {"cuMemUnmap", CS_WR_UNMAP},
        {"cuStreamBeginCapture", CS_WR_CAPBEGIN}, {"cuStreamBeginCaptureToGraph", CS_WR_CAPBEGIN},
        {"cuStreamEndCapture", CS_WR_CAPEND}, {"cuProfilerStart", CS_WR_PROFSTART}, {"cuProfilerStop", CS_WR_PROFSTOP},
        {"cuModuleGetGlobal", CS_WR_GLOBAL}, {"cuLibraryGetGlobal", CS_WR_GLOBAL},
    };
    for (int i = 0; i < CS_NFN; i++)
        for (size_t j = 0; j < sizeof roles / sizeof roles[0]; j++)
            if (strcmp(cs_fns[i].base, roles[j].base) == 0) cs_win_role[i] = (unsigned char)roles[j].role;
    cs_win_id_h2d = cs_lookup("cuMemcpyHtoD_v2");
    cs_win_id_d2h = cs_lookup("cuMemcpyDtoH_v2");
    cs_win_id_sync = cs_lookup("cuCtxSynchronize");
    cs_win_id_hostalloc = cs_lookup("cuMemAllocHost_v2");
    cs_win_id_getcur = cs_lookup("cuCtxGetCurrent");
    cs_win_id_push = cs_lookup("cuCtxPushCurrent_v2");
    cs_win_id_pop = cs_lookup("cuCtxPopCurrent_v2");
    cs_win_mode = mode;
    cs_job_init();                           /* a rank of a job: windows open at one cut (jobcut.c) */
    cs_win_open = mode == CS_W_FLIGHT;       /* the flight recorder records from the start */
    cs_win_skip = !cs_win_open;
}

/* --- live ranges --------------------------------------------------------------------- */
static U cs_win_curctx(void) {
    U c = 0;
    cs_fn1 g = cs_win_id_getcur >= 0 ? (cs_fn1)cs_resolve(cs_win_id_getcur) : NULL;
    if (g) g((U)&c);
    return c;
}

static void cs_wr_add(U ptr, U size) {
    if (!ptr || !size) return;
    U ctx = cs_win_curctx();
    pthread_mutex_lock(&cs_wr_lock);
    if (cs_nwr == cs_capwr) {
        int cap = cs_capwr ? 2 * cs_capwr : 256;
        cs_wrange *g = realloc(cs_wr, (size_t)cap * sizeof *g);
        if (!g) { pthread_mutex_unlock(&cs_wr_lock); return; }
        cs_wr = g; cs_capwr = cap;
    }
    cs_wr[cs_nwr++] = (cs_wrange){ptr, size, ctx, NULL, NULL, 0, 0, 0};
    pthread_mutex_unlock(&cs_wr_lock);
}

static void cs_wr_remove(U ptr) {
    pthread_mutex_lock(&cs_wr_lock);
    for (int i = cs_nwr - 1; i >= 0; i--)
        if (cs_wr[i].ptr == ptr) {
            free(cs_wr[i].hprev); free(cs_wr[i].dprev);
            cs_wr[i] = cs_wr[--cs_nwr];
            break;
        }
    pthread_mutex_unlock(&cs_wr_lock);
}

static void cs_win_track(const cs_fn *fn, int id, const U *a, CUresult res) {
    int role = cs_win_role[id];
    if (!role || res != 0) return;
    switch (role) {
    case CS_WR_ALLOC: { U *p = (U *)a[fn->params[0].ai]; if (p) cs_wr_add(*p, a[fn->params[1].ai]); break; }
    case CS_WR_PITCH: {   /* (dptr*, pPitch*, WidthInBytes, Height, ElementSizeBytes) */
        U *p = (U *)a[fn->params[0].ai]; size_t *pitch = (size_t *)a[fn->params[1].ai];
        if (p && pitch) cs_wr_add(*p, (U)*pitch * a[fn->params[3].ai]);
        break;
    }
    case CS_WR_GLOBAL: {  /* (dptr*, bytes*, module, name): a module's global, once */
        const void *p = (const void *)a[fn->params[0].ai], *b = (const void *)a[fn->params[1].ai];
        if (!p || !b) break;
        /* the v1 entry point writes 32-bit values (aux: the output's size) */
        U ptr = fn->params[0].aux == 4 ? *(const uint32_t *)p : *(const U *)p;
        U bytes = fn->params[1].aux == 4 ? *(const uint32_t *)b : *(const U *)b;
        if (!ptr) break;
        pthread_mutex_lock(&cs_wr_lock);
        int seen = 0;
        for (int i = 0; i < cs_nwr && !seen; i++) seen = cs_wr[i].ptr == ptr;
        pthread_mutex_unlock(&cs_wr_lock);
        if (!seen) cs_wr_add(ptr, bytes);
        break;
    }
    case CS_WR_FREE: cs_wr_remove(a[fn->params[0].ai]); break;
    case CS_WR_MAP: cs_wr_add(a[fn->params[0].ai], a[fn->params[1].ai]); break;
    case CS_WR_UNMAP: cs_wr_remove(a[fn->params[0].ai]); break;
    default: break;
    }
}

/* --- records ------------------------------------------------------------------------- */
/* state dump: bytes copied D2H, referenced, hashed; hash ns, dump ns (until drained), pause
 * ns, ns waited for the previous drain, spare device memory bytes */
static U cs_dump_stats[8];
static void cs_win_record(int op, const char *why, U bytes, U nranges) {
    uint32_t n = why ? (uint32_t)strnlen(why, 1024) : 0;
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(n) + 3 * cs_flen(8) + cs_flen(sizeof cs_dump_stats),
                   CS_REC_WINDOW)) return;
    if (op == CS_WOP_STATE) cs_put(&r, CS_F_INFO, CS_T_BYTES, cs_dump_stats, sizeof cs_dump_stats);
    r.h->fn = (uint32_t)op; r.h->seq = cs_win_serial; r.h->t_ns = cs_now();
    cs_put(&r, CS_F_MSG, CS_T_STR, why ? why : "", n);
    cs_put_val(&r, CS_F_CODE, bytes);
    cs_put_val(&r, CS_F_KIND, nranges);
    cs_put_val(&r, CS_F_HANDLE, __atomic_load_n(&cs_win_launches, __ATOMIC_RELAXED));
    cs_publish(&r);
}

/* A cuMemcpyHtoD_v2 restoring `n` bytes at `dst` from blob `serial`: PRE (aux 2: state) + POST. */
static void cs_win_emit_h2d(U dst, uint64_t serial, uint64_t n) {
    uint64_t seq = __atomic_fetch_add(&cs_ring->seq, 1, __ATOMIC_RELAXED);
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(24) + cs_flen(16), CS_REC_PRE) == 0) {
        U vals[3] = {dst, 0, n};
        r.h->fn = (uint32_t)cs_win_id_h2d; r.h->seq = seq; r.h->t_ns = cs_now(); r.h->aux = 2;
        cs_put(&r, CS_F_VALS, CS_T_VALS, vals, 24);
        cs_put_blobref(&r, 1, serial, n);
        cs_publish(&r);
    }
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr), CS_REC_POST) == 0) {
        r.h->fn = (uint32_t)cs_win_id_h2d; r.h->seq = seq; r.h->t_ns = cs_now(); r.h->result = 0; r.h->aux = 1;
        cs_publish(&r);
    }
}

/* Chunks sent before this point may sit in another snapshot: send them again. */
static void cs_blob_forget(void) {
    pthread_mutex_lock(&cs_seen_lock);
    if (cs_seen) memset(cs_seen, 0, cs_seen_cap * sizeof *cs_seen);
    cs_seen_n = 0;
    pthread_mutex_unlock(&cs_seen_lock);
}

/* Wait until this thread is the only one inside a recorded call (at most 2 s: a thread
 * blocked in the driver, waiting on another one held at the gate, must not hang us). */
static void cs_win_quiesce(void) {
    for (int i = 0; i < 20000 && __atomic_load_n(&cs_win_inflight, __ATOMIC_SEQ_CST) > 1; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* --- chunk hashes: unchanged chunks are not copied again -------------------------------- *
 * Every 4 MiB chunk of a range of 4 MiB or more is hashed on the GPU (hash_kernel.cu, loaded
 * from embedded PTX with interception paused); a chunk whose hash is the one it had at the
 * previous state dump is written as a reference to its earlier digest (a BLOB_END with no
 * pieces: the recorder takes the data from the previous snapshot), so only changed chunks
 * cross PCIe. Where the module does not load (a driver too old for the PTX, the test
 * double), chunks are copied and their digests compared on the host: the ring is spared,
 * not the bus. CUDASNAP_WIN_HASH=host forces that, =off copies everything every time. */
#include "shim_hash_ptx.h"
static int cs_hash_mode = -2;            /* -2 not tried, 1 GPU, 0 host digests, -1 off */
static U cs_hash_fn, cs_hash_buf, cs_hash_cap;

static void cs_hash_init(void) {
    const char *e = getenv("CUDASNAP_WIN_HASH");
    cs_hash_mode = e && strcmp(e, "off") == 0 ? -1 : 0;
    if (e && strcmp(e, "host") == 0) return;
    if (cs_hash_mode < 0) return;
    int load = cs_lookup("cuModuleLoadData"), get = cs_lookup("cuModuleGetFunction");
    U mod = 0, fn = 0;
    cs_fn2 ld = load >= 0 ? (cs_fn2)cs_resolve(load) : NULL;
    cs_fn3 gf = get >= 0 ? (cs_fn3)cs_resolve(get) : NULL;
    if (ld && gf && ld((U)&mod, (U)cs_hash_ptx) == 0 && gf((U)&fn, mod, (U)"cs_hash_chunks") == 0) {
        cs_hash_fn = fn;
        cs_hash_mode = 1;
    }
}

/* The hashes of the nch chunks of [ptr, ptr+size) into h (host); 0 on success. */
static int cs_hash_gpu(U ptr, U size, U nch, U *h) {
    static int id_alloc = -2, id_free, id_memset, id_launch;
    if (id_alloc == -2) {
        id_alloc = cs_lookup("cuMemAlloc_v2"); id_free = cs_lookup("cuMemFree_v2");
        id_memset = cs_lookup("cuMemsetD8_v2"); id_launch = cs_lookup("cuLaunchKernel");
    }
    if (id_alloc < 0 || id_free < 0 || id_memset < 0 || id_launch < 0) return -1;
    if (cs_hash_cap < nch * 8) {
        if (cs_hash_buf) ((cs_fn1)cs_resolve(id_free))(cs_hash_buf);
        cs_hash_buf = 0; cs_hash_cap = 0;
        U want = nch * 8 < (64u << 10) ? (64u << 10) : nch * 8;
        if (((cs_fn2)cs_resolve(id_alloc))((U)&cs_hash_buf, want) != 0) { cs_hash_buf = 0; return -1; }
        cs_hash_cap = want;
    }
    if (((cs_fn3)cs_resolve(id_memset))(cs_hash_buf, 0, nch * 8) != 0) return -1;
    U nwords = size / 16, chunk_words = CS_CHUNK / 16;
    unsigned bpc = 8, threads = 256;
    void *params[] = {&ptr, &nwords, &chunk_words, &bpc, &cs_hash_buf};
    typedef CUresult (*launch_t)(U, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, U, void **, void **);
    if (((launch_t)cs_resolve(id_launch))(cs_hash_fn, (unsigned)(nch * bpc), 1, 1, threads, 1, 1, 0, 0, params, NULL) != 0)
        return -1;
    cs_fn3 d2h = (cs_fn3)cs_resolve(cs_win_id_d2h);
    return d2h((U)h, cs_hash_buf, nch * 8) == 0 ? 0 : -1;
}

/* A blob made of one chunk sent before (its digest): no data through the ring. */
static uint64_t cs_blob_ref(const unsigned char dig[16], uint64_t size) {
    uint64_t serial = __atomic_add_fetch(&cs_ring->blob_serial, 1, __ATOMIC_RELAXED);
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(8) + cs_flen(16), CS_REC_BLOB_END)) return 0;
    r.h->seq = serial;
    r.h->fn = 1;                             /* a window state's */
    cs_put_val(&r, 0, size);
    cs_put(&r, CS_F_DIGEST, CS_T_BYTES, dig, 16);
    cs_publish(&r);
    return serial;
}

/* Send `run` bytes read back to `src` (host) as the state of [dst, dst+run). dig: the digests
 * of the run's 4 MiB chunks (NULL: a range too small for chunk bookkeeping), updated with
 * what was sent; cmp: chunks whose digest equals dig's go as references (host digests:
 * the ring is spared, not the bus). Returns -1 when a chunk did not reach the ring. */
static int cs_state_send(U dst, const char *src, U run, unsigned char *dig, int cmp) {
    int lost = 0;
    if (!cmp) {
        /* one blob for the run: its chunks are digested and copied by the helper threads */
        unsigned char digs[16 * (CS_WSTAGE / CS_CHUNK)];
        cs_blob_dig_out = digs;
        uint64_t serial = cs_blob(src, run);
        cs_blob_dig_out = NULL;
        if (dig && serial) memcpy(dig, digs, 16 * ((run + CS_CHUNK - 1) / CS_CHUNK));
        if (!serial) lost = 1;
        cs_win_emit_h2d(dst, serial, run);
        cs_dump_stats[0] += run;
        return lost ? -1 : 0;
    }
    for (U p = 0; p < run; p += CS_CHUNK) {
        U len = run - p < CS_CHUNK ? run - p : CS_CHUNK;
        unsigned char *d = dig + 16 * (p / CS_CHUNK), now[16];
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits(src + p, len));
        if (memcmp(cn.digest, d, 16) == 0) {
            cs_win_emit_h2d(dst + p, cs_blob_ref(d, len), len);
            cs_dump_stats[1] += len;
            continue;
        }
        cs_blob_dig_out = now;
        uint64_t serial = cs_blob(src + p, len);
        cs_blob_dig_out = NULL;
        if (serial) memcpy(d, now, 16); else lost = 1;
        cs_win_emit_h2d(dst + p, serial, len);
        cs_dump_stats[0] += len;
    }
    return lost ? -1 : 0;
}

#include "shim_window_drain.c"

/* One range: hash (GPU), then copy the chunks that changed, into spare device memory to be
 * drained after the pause (shim_window_drain.c), or else in runs of up to CS_WSTAGE. */
static void cs_dump_range(cs_wrange *w, cs_fn3 d2h, unsigned *failed) {
    U nch = w->size >= CS_CHUNK ? (w->size + CS_CHUNK - 1) / CS_CHUNK : 0;
    if (nch && w->nch != nch) {
        free(w->hprev); free(w->dprev);
        w->hprev = calloc(nch, 8); w->dprev = calloc(nch, 16);
        w->nch = w->hprev && w->dprev ? nch : 0; w->hvalid = w->dvalid = 0;
        if (!w->nch) { free(w->hprev); free(w->dprev); w->hprev = NULL; w->dprev = NULL; }
        nch = w->nch;
    }
    U *hnow = NULL;
    int gpu = 0;
    if (nch && cs_hash_mode == 1 && w->size % 16 == 0 && (hnow = malloc(nch * 8))) {
        U t0 = cs_mono();
        gpu = cs_hash_gpu(w->ptr, w->size, nch, hnow) == 0;
        cs_dump_stats[3] += cs_mono() - t0;
        if (gpu) cs_dump_stats[2] += w->size;
    }
    int refs = gpu && w->hvalid && w->dvalid;        /* unchanged chunks can be references */
    if (cs_drain_plan(w, hnow, gpu, refs)) return;   /* hnow is the drain's now */
    U off = 0;
    int lost = 0;                            /* a chunk did not reach the ring: no digests to trust */
    while (off < w->size) {
        U ref = cs_win_ref_unchanged(w, hnow, refs, off);   /* unchanged: a reference */
        if (ref) {
            off += ref;
            continue;
        }
        U c = off / CS_CHUNK;
        /* a run of changed chunks, at most the staging buffer */
        U run = 0;
        while (off + run < w->size && run < CS_WSTAGE) {
            U cc = (off + run) / CS_CHUNK;
            if (run && refs && hnow[cc] == w->hprev[cc]) break;
            U len = w->size - (off + run) < CS_CHUNK ? w->size - (off + run) : CS_CHUNK;
            run += len;
        }
        if (d2h((U)cs_wstage, w->ptr + off, run) != 0) { (*failed)++; w->dvalid = 0; free(hnow); return; }
        int cmp = nch && !gpu && w->dvalid && cs_hash_mode == 0;
        if (cs_state_send(w->ptr + off, cs_wstage, run, nch ? w->dprev + 16 * c : NULL, cmp)) lost = 1;
        off += run;
    }
    if (nch) {
        w->dvalid = !lost;
        if (gpu) { memcpy(w->hprev, hnow, nch * 8); w->hvalid = 1; } else w->hvalid = 0;
    }
    free(hnow);
}

/* Write every live range's contents as state records. Returns bytes written. */
static U cs_win_dump(U *nranges) {
    U total = 0, t0 = cs_mono();
    *nranges = 0;
    memset(cs_dump_stats, 0, sizeof cs_dump_stats);
    cs_fn0 csync = cs_win_id_sync >= 0 ? (cs_fn0)cs_resolve(cs_win_id_sync) : NULL;
    cs_fn3 d2h = cs_win_id_d2h >= 0 ? (cs_fn3)cs_resolve(cs_win_id_d2h) : NULL;
    cs_fn1 push = cs_win_id_push >= 0 ? (cs_fn1)cs_resolve(cs_win_id_push) : NULL;
    cs_fn1 pop = cs_win_id_pop >= 0 ? (cs_fn1)cs_resolve(cs_win_id_pop) : NULL;
    if (!csync || !d2h || cs_win_id_h2d < 0) return 0;
    pthread_mutex_lock(&cs_wr_lock);         /* other threads wait at the gate meanwhile */
    if (!cs_nwr) { pthread_mutex_unlock(&cs_wr_lock); return 0; }
    U cur = cs_win_curctx(), dummy = 0;
    if (!cs_wstage) {
        cs_fn2 ha = cs_win_id_hostalloc >= 0 ? (cs_fn2)cs_resolve(cs_win_id_hostalloc) : NULL;
        void *p = NULL;
        U c0 = cs_wr[0].ctx;
        int pushed = c0 && c0 != cur && push && pop && push(c0) == 0;
        if (ha && (cur || pushed) && ha((U)&p, CS_WSTAGE) == 0) cs_wstage_pinned = 1; else p = NULL;
        if (pushed) pop((U)&dummy);
        cs_wstage = p ? p : malloc(CS_WSTAGE);
        if (!cs_wstage) { pthread_mutex_unlock(&cs_wr_lock); return 0; }
    }
    U synced = 0;
    unsigned failed = 0;
    cs_drain_begin();
    for (int i = 0; i < cs_nwr; i++) {
        cs_wrange *w = &cs_wr[i];
        int pushed = w->ctx && w->ctx != cur && push && pop && push(w->ctx) == 0;
        if (w->ctx != synced || !synced) { csync(); synced = w->ctx; }
        if (cs_hash_mode == -2) cs_hash_init();
        int spared = cs_dq.nr;
        cs_dump_range(w, d2h, &failed);
        if (cs_dq.nr != spared) csync();      /* the copies to spare memory are done before the program goes on */
        total += w->size;
        (*nranges)++;
        if (pushed) pop((U)&dummy);
    }
    pthread_mutex_unlock(&cs_wr_lock);
    cs_dump_stats[4] = cs_mono() - t0;
    cs_dq.t0 = t0;
    if (failed) {
        char msg[160];
        snprintf(msg, sizeof msg, "window state: %u live range(s) could not be read back (unmapped or no access yet)", failed);
        cs_note(msg);
    }
    return total;
}

/* Open a window or take a checkpoint: marker, then the state. */
static void cs_win_start(int op, const char *why) {
    uint64_t me = cs_thread();
    U waited = cs_drain_wait();              /* the previous state is still draining */
    U t0 = cs_mono();
    __atomic_store_n(&cs_win_dumper, me, __ATOMIC_SEQ_CST);
    cs_win_quiesce();
    cs_depth++;
    cs_patient = 1;
    cs_win_serial++;
    cs_blob_forget();
    cs_hm_forget();                          /* host-written memory: recorded again at its next launch */
    cs_win_open = 1; cs_win_skip = 0;
    cs_win_record(op, why, 0, 0);
    U nr = 0, bytes = cs_win_dump(&nr);
    cs_dump_stats[5] = cs_mono() - t0;
    cs_dump_stats[6] = waited;
    if (!cs_drain_launch(why, bytes, nr, cs_dq.t0)) cs_win_record(CS_WOP_STATE, why, bytes, nr);
    cs_patient = 0;
    cs_depth--;
    if (!cs_job_holding) __atomic_store_n(&cs_win_dumper, 0, __ATOMIC_SEQ_CST);   /* jobcut.c releases */
}

#include "shim_window_endstate.c"

static void cs_win_close(const char *why) {
    if (!cs_win_open) return;
    cs_drain_wait();                         /* the window's state is complete before it ends */
    if (cs_win_mode != CS_W_FLIGHT) cs_win_endstate(why);
    cs_win_record(CS_WOP_CLOSE, why, 0, 0);
    cs_win_open = 0; cs_win_skip = 1;
}

#include "shim_window_jobcut.c"

static void cs_win_toggle(const char *why) {
    if (cs_win_open) cs_win_close_cut(why); else cs_win_open_cut(why);
}

/* --- triggers ------------------------------------------------------------------------ */
/* NVTX callback (shim_nvtx.c): ask for a window at the next driver call. */
static void cs_win_nvtx(int op, uint64_t id, const char *name) {
    if (cs_win_mode != CS_W_NVTX) return;
    if ((op == 1 || op == 3) && !cs_win_nvtx_id && name && strcmp(name, cs_win_name) == 0) {
        uint64_t k = __atomic_add_fetch(&cs_win_matches, 1, __ATOMIC_ACQ_REL);
        if (cs_win_k && k != cs_win_k) return;
        cs_win_nvtx_id = op == 1 ? id + 1 : id;
        cs_win_nvtx_push = op == 1;
        __atomic_store_n(&cs_win_pending, 1, __ATOMIC_RELEASE);
    } else if (cs_win_nvtx_id && ((op == 2 && cs_win_nvtx_push && id + 1 == cs_win_nvtx_id)
                                  || (op == 4 && !cs_win_nvtx_push && id == cs_win_nvtx_id))) {
        cs_win_nvtx_id = 0;
        __atomic_store_n(&cs_win_pending, 2, __ATOMIC_RELEASE);
    }
}

/* What a kernel's name says, for its layout entry (shim_hooks.c): it matches a `kernel:`
 * window, it is a collective of a job. Asked once per handle, not per launch. */
static unsigned cs_name_flags(const char *nm) {
    unsigned fl = 0;
    if (!nm || !*nm) return 0;
    if (cs_win_mode == CS_W_KERNEL && regexec(&cs_win_rx, nm, 0, NULL, 0) == 0) fl |= CS_NF_WINDOW;
    if (cs_job_n > 0 && regexec(&cs_job_rx, nm, 0, NULL, 0) == 0) fl |= CS_NF_COLLECTIVE;
    return fl;
}

/* The flags of launched function f (its layout is known from the launch's first sight). */
static unsigned cs_fn_flags(U f) {
    cs_depth++;
    const cs_layout *L = cs_layout_of(f);
    cs_depth--;
    return L ? L->flags : 0;
}

static int cs_win_kernel_match(U f) {
    return (cs_fn_flags(f) & CS_NF_WINDOW) != 0;
}

/* Before a recorded call: wait out another thread's state dump, act on requests. Returns the
 * call's launch number + 1 (0: not a launch). */
static uint64_t cs_win_before(const cs_fn *fn, int id, const U *a) {
    uint64_t me = cs_thread();
    for (;;) {
        __atomic_fetch_add(&cs_win_inflight, 1, __ATOMIC_SEQ_CST);
        uint64_t d = __atomic_load_n(&cs_win_dumper, __ATOMIC_SEQ_CST);
        if (!d || d == me) break;
        __atomic_fetch_sub(&cs_win_inflight, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&cs_win_dumper, __ATOMIC_SEQ_CST)) { struct timespec ts = {0, 50000}; nanosleep(&ts, NULL); }
    }
    int role = cs_win_role[id];
    if (role == CS_WR_CAPBEGIN || role == CS_WR_CAPEND) return 0;
    int capturing = __atomic_load_n(&cs_win_capturing, __ATOMIC_RELAXED) > 0;
    int is_launch = fn->hook == CS_H_LAUNCH;
    uint64_t n = __atomic_load_n(&cs_win_launches, __ATOMIC_RELAXED);   /* this launch's number */
    if (!capturing) {
        if (cs_job_n > 0) cs_job_due();      /* a rank behind its peers reached their collective */
        uint32_t req = __atomic_load_n(&cs_ring->win_req, __ATOMIC_ACQUIRE);
        uint32_t seen = __atomic_load_n(&cs_win_req_seen, __ATOMIC_ACQUIRE);
        if (req != seen && __atomic_compare_exchange_n(&cs_win_req_seen, &seen, req, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            if (cs_win_mode == CS_W_FLIGHT) cs_win_start(CS_WOP_CHECKPOINT, "checkpoint");
            else for (uint32_t i = seen; i != req; i++) cs_win_toggle(cs_win_mode == CS_W_SIGNAL ? "signal" : "time");
        }
        int pend = __atomic_exchange_n(&cs_win_pending, 0, __ATOMIC_ACQ_REL);
        if (pend == 1) cs_win_open_cut("nvtx");
        else if (pend == 2) cs_win_close_cut("nvtx");
        /* launch A passed inside a capture: open now, and hold it to the next launch at least */
        if (cs_win_mode == CS_W_LAUNCHES && !cs_win_open && !__atomic_load_n(&cs_win_launches_done, __ATOMIC_SEQ_CST)
            && n > cs_win_a && !__atomic_exchange_n(&cs_win_late_open, 1, __ATOMIC_ACQ_REL)) {
            if (cs_win_b < n) cs_win_b = n;
            cs_win_open_cut_if("launches (opened after a stream capture)", 1);
        }
        if (cs_win_mode == CS_W_KERNEL && !cs_win_open && __atomic_load_n(&cs_win_defer_open, __ATOMIC_ACQUIRE)
            && __atomic_exchange_n(&cs_win_defer_open, 0, __ATOMIC_ACQ_REL)) {
            if (cs_win_close_at < n) cs_win_close_at = n;
            cs_win_open_cut_if("kernel (opened after a stream capture)", 1);
        }
    }
    if (role == CS_WR_PROFSTART && cs_win_mode == CS_W_PROFILER && !cs_win_open) cs_win_open_cut_if("profiler", 1);
    if (!is_launch) return 0;
    if (cs_win_mode == CS_W_LAUNCHES && n == cs_win_a && !cs_win_open && !cs_win_launches_done) {
        if (!capturing) cs_win_open_cut_if("launches", 1);
        else if (!cs_win_deferred_noted++)
            cs_note("window: its first launch fell inside a stream capture; it opens at the first call after the capture");
    }
    if (cs_win_mode == CS_W_KERNEL && (cs_win_open ? n < cs_win_close_at : 1)) {
        U f = 0, kp = 0, ex = 0;
        if (cs_launch_args(fn, a, &f, &kp, &ex) && f && cs_win_kernel_match(f)) {
            uint64_t k = __atomic_add_fetch(&cs_win_matches, 1, __ATOMIC_ACQ_REL);
            if (!cs_win_k || k == cs_win_k) {
                cs_win_close_at = n + cs_win_ctxn;
                if (cs_win_open) { /* already open: the close moves */ }
                else if (!capturing) cs_win_open_cut_if("kernel", 1);
                else {
                    cs_win_defer_open = 1;
                    if (!cs_win_deferred_noted++)
                        cs_note("window: the matched launch fell inside a stream capture; it opens at the first call after the capture");
                }
            }
        }
    }
    /* counted after the opens above: a state taken at this launch holds no part of it */
    if (!capturing && cs_job_n > 0) cs_job_count(fn, a);
    __atomic_fetch_add(&cs_win_launches, 1, __ATOMIC_RELAXED);
    return n + 1;
}

static void cs_win_after(const cs_fn *fn, int id, const U *a, CUresult res, uint64_t launch) {
    int role = cs_win_role[id];
    if (role) {
        cs_win_track(fn, id, a, res);
        if (res == 0 && role == CS_WR_CAPBEGIN) __atomic_fetch_add(&cs_win_capturing, 1, __ATOMIC_RELAXED);
        if (role == CS_WR_CAPEND && __atomic_load_n(&cs_win_capturing, __ATOMIC_RELAXED) > 0)
            __atomic_fetch_sub(&cs_win_capturing, 1, __ATOMIC_RELAXED);
        if (role == CS_WR_PROFSTOP && cs_win_mode == CS_W_PROFILER) cs_win_close_cut("profiler");
    }
    /* a close reached inside a stream capture waits for its end (see cs_win_defer_open) */
    int capturing = __atomic_load_n(&cs_win_capturing, __ATOMIC_RELAXED) > 0;
    if (launch && cs_win_open) {
        uint64_t n = launch - 1;
        if ((cs_win_mode == CS_W_LAUNCHES && n >= cs_win_b) || (cs_win_mode == CS_W_KERNEL && n >= cs_win_close_at))
            __atomic_store_n(&cs_win_close_wait, 1, __ATOMIC_RELEASE);
    }
    /* read first: an exchange on every call of an open window would bounce the line between threads */
    if (!capturing && cs_win_open && __atomic_load_n(&cs_win_close_wait, __ATOMIC_ACQUIRE)
        && __atomic_exchange_n(&cs_win_close_wait, 0, __ATOMIC_ACQ_REL)) {
        if (cs_win_mode == CS_W_LAUNCHES) {
            /* done before the close: another thread past launch A must never see the window
             * neither open nor done (it would open a second one, late) */
            __atomic_store_n(&cs_win_launches_done, 1, __ATOMIC_SEQ_CST);
            cs_win_close_cut("launches");
        }
        else if (cs_win_mode == CS_W_KERNEL) { cs_win_close_cut("kernel"); cs_win_close_at = ~0ull; }
    }
    __atomic_fetch_sub(&cs_win_inflight, 1, __ATOMIC_SEQ_CST);
}
