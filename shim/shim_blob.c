/* Large host payloads (H2D sources, D2H results, module images) as content-addressed
 * 4 MiB chunks. Included by shim_core.c.
 *
 * The shim digests each chunk with XXH3-128 (the snapshot's chunk id) and sends only the
 * chunks of 64 KiB or more that this process has not sent before: re-uploading a buffer
 * costs one read of it, and the recorder does no hashing at all (it still stores a chunk
 * once per file). The BLOB_END record lists the chunk digests, from
 * which the recorder names the blob (formats/SCHEMA.md). A sent chunk's digest is taken
 * from its copy in the ring, so a program changing its buffer meanwhile can never make a
 * chunk disagree with its id. Payloads of CS_PAR_MIN bytes or more are digested and
 * copied by a few helper threads beside the calling one (CUDASNAP_COPY_THREADS, default
 * half the CPUs, at most 8; 0 turns them off). Helpers never call the driver and block
 * every signal. */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "third_party/xxhash/xxhash.h"

#define CS_CHUNK (4u << 20)
#define CS_PAR_MIN (8u << 20)
#define CS_SUB (256u << 10)          /* copy-then-digest step, so the digest reads from cache */
#define CS_DEDUP_MIN (64u << 10)     /* chunks this big are deduplicated in the shim */

/* --- digests of the chunks this process has sent ------------------------------------ */
typedef struct { uint64_t lo, hi; } cs_dig;
static pthread_mutex_t cs_seen_lock = PTHREAD_MUTEX_INITIALIZER;
static cs_dig *cs_seen;              /* open addressing; all-zero = empty slot */
static size_t cs_seen_cap, cs_seen_n;

static inline cs_dig cs_dig_of(const unsigned char *d) { cs_dig k; memcpy(&k, d, 16); return k; }

static int cs_seen_find(cs_dig k, int add) {
    if (!(k.lo | k.hi)) return 0;
    pthread_mutex_lock(&cs_seen_lock);
    int found = 0;
    if (add && (cs_seen_n + 1) * 2 > cs_seen_cap) {
        size_t ncap = cs_seen_cap ? cs_seen_cap * 2 : 1024;
        cs_dig *nt = calloc(ncap, sizeof *nt);
        if (nt) {
            for (size_t i = 0; i < cs_seen_cap; i++) {
                cs_dig e = cs_seen[i];
                if (!(e.lo | e.hi)) continue;
                size_t j = e.lo & (ncap - 1);
                while (nt[j].lo | nt[j].hi) j = (j + 1) & (ncap - 1);
                nt[j] = e;
            }
            free(cs_seen); cs_seen = nt; cs_seen_cap = ncap;
        } else add = 0;              /* no memory: the chunk is just sent again next time */
    }
    if (cs_seen_cap) {
        size_t j = k.lo & (cs_seen_cap - 1);
        for (;;) {
            cs_dig e = cs_seen[j];
            if (!(e.lo | e.hi)) break;
            if (e.lo == k.lo && e.hi == k.hi) { found = 1; break; }
            j = (j + 1) & (cs_seen_cap - 1);
        }
        if (!found && add) { cs_seen[j] = k; cs_seen_n++; }
    }
    pthread_mutex_unlock(&cs_seen_lock);
    return found;
}

/* --- one blob's chunks, done by the caller and, for big payloads, the helpers --------- */
typedef struct {
    const char *src;
    uint64_t size, serial;
    uint32_t nchunks;
    uint32_t next;                   /* next chunk to take (atomic) */
    int failed;                      /* a ring reservation failed: the blob is lost */
    unsigned char *digests;          /* 16 bytes per chunk */
    int patient;                     /* a state dump's: wait out a full ring (cs_patient) */
} cs_blobjob;

static void cs_chunk(cs_blobjob *j, uint32_t i) {
    uint64_t off = (uint64_t)i * CS_CHUNK;
    uint32_t n = (uint32_t)((j->size - off) < CS_CHUNK ? (j->size - off) : CS_CHUNK);
    const char *s = j->src + off;
    XXH128_canonical_t c;
    /* big chunks: digest the source first, and send nothing if this process sent it before;
     * small ones (scalars, launch-sized copies) are just sent: one pass, no lock */
    int dedup = n >= CS_DEDUP_MIN;
    if (dedup) {
        XXH128_canonicalFromHash(&c, XXH3_128bits(s, n));
        if (cs_seen_find(cs_dig_of(c.digest), 0)) { memcpy(j->digests + 16ull * i, c.digest, 16); return; }
    }
    /* a chunk too big for a quarter of the ring goes as parts (a small CUDASNAP_RING_MB):
     * every part but the last has no digest, the last one its offset (F_CODE) and the digest */
    uint64_t room = (cs_mask + 1) / 4;
    uint32_t part = n;
    if ((uint64_t)sizeof(cs_rec_hdr) + cs_flen(16) + cs_flen(8) + cs_flen(n) > room)
        part = room > 2 * 4096 ? (uint32_t)((room - 4096) & ~4095ull) : 4096;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    for (uint32_t po = 0; po < n; po += part) {
        uint32_t pn = n - po < part ? n - po : part;
        int last = po + pn == n;
        cs_rec r;
        uint32_t len = (uint32_t)sizeof(cs_rec_hdr) + (last ? cs_flen(16) : 0) + (part < n ? cs_flen(8) : 0) + cs_flen(pn);
        if (cs_reserve(&r, len, CS_REC_BLOB_PIECE)) {
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        r.h->seq = j->serial;
        r.h->aux = i;
        r.h->fn = j->patient;                         /* 1: a window state's chunk */
        cs_field_hdr *df = NULL;
        if (last) {                                   /* digest field, filled after the copy */
            df = (cs_field_hdr *)r.p;
            df->idx = CS_F_DIGEST; df->tag = CS_T_BYTES; df->len = 16;
            r.p += cs_flen(16); r.h->nfields++;
        }
        if (part < n) cs_put_val(&r, CS_F_CODE, po);
        cs_field_hdr *f = (cs_field_hdr *)r.p;
        f->idx = 0; f->tag = CS_T_BYTES; f->len = pn;
        char *dst = (char *)(f + 1);
        for (uint32_t o = 0; o < pn; o += CS_SUB) {
            uint32_t k = pn - o < CS_SUB ? pn - o : CS_SUB;
            memcpy(dst + o, s + po + o, k);
            XXH3_128bits_update(&st, dst + o, k);
        }
        if (last) {
            XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
            memcpy(df + 1, c.digest, 16);
        }
        r.p += cs_flen(pn); r.h->nfields++;
        cs_publish(&r);
    }
    memcpy(j->digests + 16ull * i, c.digest, 16);
    if (dedup) cs_seen_find(cs_dig_of(c.digest), 1);   /* after publishing: a later reference
                                                          never overtakes the data in the ring */
}

static void cs_job_run(cs_blobjob *j) {
    int was = cs_patient;
    cs_patient = was || j->patient;
    for (;;) {
        uint32_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->nchunks) break;
        cs_chunk(j, i);
    }
    cs_patient = was;
}

/* --- helper threads ----------------------------------------------------------------- */
static struct {
    pthread_mutex_t mu;              /* guards everything below */
    pthread_cond_t go, idle;
    pthread_mutex_t busy;            /* one parallel blob at a time; others go serial */
    cs_blobjob *job;
    uint64_t gen;
    int nthreads, running;           /* started helpers; helpers still on the current job */
    int started;                     /* 0 not yet, 1 started (or none wanted) */
} cs_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
             PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0, 0};

static void *cs_helper(void *arg) {
    (void)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&cs_pool.mu);
    for (;;) {
        while (cs_pool.gen == seen) pthread_cond_wait(&cs_pool.go, &cs_pool.mu);
        seen = cs_pool.gen;
        cs_blobjob *j = cs_pool.job;
        pthread_mutex_unlock(&cs_pool.mu);
        if (j) cs_job_run(j);
        pthread_mutex_lock(&cs_pool.mu);
        if (--cs_pool.running == 0) pthread_cond_broadcast(&cs_pool.idle);
    }
    return NULL;
}

static int cs_copy_threads_wanted(void) {
    const char *e = getenv("CUDASNAP_COPY_THREADS");
    if (e && *e) { int n = atoi(e); return n < 0 ? 0 : (n > 32 ? 32 : n); }
    cpu_set_t cs;
    int cpus = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int n = cpus / 2;
    return n > 8 ? 8 : n;
}

static void cs_pool_start(void) {
    pthread_mutex_lock(&cs_pool.mu);
    if (!cs_pool.started) {
        cs_pool.started = 1;
        int want = cs_copy_threads_wanted();
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);   /* helpers inherit: signals stay the program's */
        for (int i = 0; i < want; i++) {
            pthread_t t;
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            pthread_attr_setstacksize(&at, 256u << 10);
            if (pthread_create(&t, &at, cs_helper, NULL) == 0) {
                pthread_setname_np(t, "cudasnap-copy");
                cs_pool.nthreads++;
            }
            pthread_attr_destroy(&at);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&cs_pool.mu);
}

static void cs_job_parallel(cs_blobjob *j) {
    if (!cs_pool.started) cs_pool_start();
    if (cs_pool.nthreads == 0 || pthread_mutex_trylock(&cs_pool.busy) != 0) { cs_job_run(j); return; }
    pthread_mutex_lock(&cs_pool.mu);
    cs_pool.job = j;
    cs_pool.running = cs_pool.nthreads;
    cs_pool.gen++;
    pthread_cond_broadcast(&cs_pool.go);
    pthread_mutex_unlock(&cs_pool.mu);
    cs_job_run(j);
    pthread_mutex_lock(&cs_pool.mu);
    while (cs_pool.running) pthread_cond_wait(&cs_pool.idle, &cs_pool.mu);
    cs_pool.job = NULL;
    pthread_mutex_unlock(&cs_pool.mu);
    pthread_mutex_unlock(&cs_pool.busy);
}

/* A forked child has no helpers and a snapshot of its own: start afresh. */
static void cs_blob_atfork_child(void) {
    pthread_mutex_init(&cs_seen_lock, NULL);
    free(cs_seen); cs_seen = NULL; cs_seen_cap = cs_seen_n = 0;
    pthread_mutex_init(&cs_pool.mu, NULL);
    pthread_mutex_init(&cs_pool.busy, NULL);
    pthread_cond_init(&cs_pool.go, NULL);
    pthread_cond_init(&cs_pool.idle, NULL);
    cs_pool.job = NULL; cs_pool.gen = 0; cs_pool.nthreads = cs_pool.running = cs_pool.started = 0;
}

/* Set by a window's state dump (shim_window.c): receives every chunk's digest (room for all). */
CS_TLS unsigned char *cs_blob_dig_out;

/* Stream a host buffer into the ring; returns the blob serial (0: lost, recorder gone). */
static uint64_t cs_blob(const void *src, uint64_t size) {
    cs_blobjob j = {(const char *)src, size, 0, (uint32_t)((size + CS_CHUNK - 1) / CS_CHUNK), 0, 0, NULL, cs_patient};
    j.serial = __atomic_add_fetch(&cs_ring->blob_serial, 1, __ATOMIC_RELAXED);
    unsigned char small[16 * 4];
    j.digests = j.nchunks <= 4 ? small : malloc(16ull * j.nchunks);
    if (!j.digests) return 0;
    if (size >= CS_PAR_MIN) cs_job_parallel(&j); else cs_job_run(&j);
    if (cs_blob_dig_out && j.nchunks && !j.failed) memcpy(cs_blob_dig_out, j.digests, 16ull * j.nchunks);
    uint64_t serial = 0;
    cs_rec r;
    if (!j.failed && cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(8) + cs_flen(16u * j.nchunks),
                                CS_REC_BLOB_END) == 0) {
        r.h->seq = j.serial;
        r.h->fn = j.patient;
        cs_put_val(&r, 0, size);
        cs_put(&r, CS_F_DIGEST, CS_T_BYTES, j.digests, 16u * j.nchunks);
        cs_publish(&r);
        serial = j.serial;
    }
    if (j.digests != small) free(j.digests);
    return serial;
}
