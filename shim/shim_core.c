/* cudasnap interception shim: the engine. Included by the cffi-built module after the
 * generated API table (cs_fns[], cs_w_N wrappers) -- see build_shim.py.
 *
 * Hot path (cs_call): reserve ring space with one CAS, copy fixed-size fields, publish.
 * No locks around the real call, no syscalls per call, no allocation per call. The
 * recorder (capture/recorder.py) drains the ring in another process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ring.h"

typedef uint64_t U;
typedef int CUresult;
typedef CUresult (*cs_gen_fn)(U, U, U, U, U, U, double, double, double, double, double, double,
                              double, double, U, U, U, U, U, U, U, U, U, U, U, U, U, U);

/* @GENERATED_TABLE@ (build_shim.py puts the API table here) */
static int cs_lookup(const char *name);
static void *cs_wrap(int id, void *realp);
static int cs_is_ours(void *p);
static CUresult cs_call(int id, U *a, double *d);

/* --- shared state ------------------------------------------------------------------ */
static void *(*real_dlsym)(void *, const char *);
static void *cs_libcuda;                 /* handle the program used for libcuda */
static void *cs_real[CS_NFN];            /* real driver entry per API id */
static cs_ring_hdr *cs_ring;             /* NULL: not recording */
static char *cs_data;
static uint64_t cs_mask;
static int cs_state;                     /* 0 untouched, 1 recording, -1 off */
static pid_t cs_pid;
static pthread_mutex_t cs_init_lock = PTHREAD_MUTEX_INITIALIZER;
/* initial-exec TLS: no __tls_get_addr per access (the shim is preloaded, so static TLS has room) */
#define CS_TLS static __thread __attribute__((tls_model("initial-exec")))
CS_TLS uint64_t cs_tid;
CS_TLS int cs_depth;            /* >0 inside a recorded call: nested driver calls pass through */

#define REAL(id) ((cs_gen_fn)cs_resolve(id))

/* CLOCK_MONOTONIC in ns: the recorder's heartbeat and the ring's start are in it */
static inline uint64_t cs_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Record timestamps: the TSC where the kernel itself keeps time with it (clocksource "tsc":
 * invariant and synchronized across cores), a third of the cost of clock_gettime; the
 * recorder maps ticks to CLOCK_MONOTONIC ns (ring header: clock, clock_tsc0, clock_ns0).
 * CUDASNAP_CLOCK=ns turns it off. */
static int cs_clock_tsc;
#if defined(__x86_64__)
#include <x86intrin.h>
static int cs_tsc_usable(void) {
    const char *e = getenv("CUDASNAP_CLOCK");
    if (e && strcmp(e, "ns") == 0) return 0;
    char buf[32] = {0};
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n >= 3 && strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == 0);
}
static inline uint64_t cs_now(void) { return cs_clock_tsc ? __rdtsc() : cs_mono(); }
#else
static int cs_tsc_usable(void) { return 0; }
static inline uint64_t cs_now(void) { return cs_mono(); }
#endif

/* A (TSC, CLOCK_MONOTONIC ns) pair read back to back (the closest of three tries). */
static void cs_clock_pair(uint64_t *tsc, uint64_t *ns) {
#if defined(__x86_64__)
    uint64_t best = ~0ull;
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc(), t = cs_mono(), b = __rdtsc();
        if (b - a < best) { best = b - a; *tsc = a + (b - a) / 2; *ns = t; }
    }
#else
    *tsc = 0; *ns = cs_mono();
#endif
}

static inline uint64_t cs_thread(void) {
    if (!cs_tid) cs_tid = (uint64_t)syscall(SYS_gettid);
    return cs_tid;
}

static void *cs_dlsym(void *h, const char *name) {
    if (!real_dlsym) {
        real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    return real_dlsym ? real_dlsym(h, name) : NULL;
}

static void *cs_cuda_handle(void) {
    if (!cs_libcuda) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
        cs_libcuda = h;
    }
    return cs_libcuda;
}

/* Real entry for an API id: what the program was handed, else libcuda's export. */
static __attribute__((noinline)) void *cs_resolve_slow(int id) {
    void *p;
    void *h = cs_cuda_handle();
    p = h ? cs_dlsym(h, cs_fns[id].name) : NULL;
    if (p) {
        void *expected = NULL;
        __atomic_compare_exchange_n(&cs_real[id], &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        p = cs_real[id];
    }
    return p;
}

static inline void *cs_resolve(int id) {
    void *p = __atomic_load_n(&cs_real[id], __ATOMIC_ACQUIRE);
    return p ? p : cs_resolve_slow(id);
}

/* --- ring ---------------------------------------------------------------------------- */
typedef struct { cs_rec_hdr *h; char *p; char *end; uint64_t pos; } cs_rec;

static int cs_recorder_alive(void) {
    uint64_t beat = __atomic_load_n(&cs_ring->recorder_beat_ns, __ATOMIC_RELAXED);
    /* before its first beat the recorder is still finding the new ring: give it 10 s */
    if (!beat) return (int64_t)(cs_mono() - cs_ring->start_ns) < 10000000000ll;
    /* signed: the recorder may have beaten after we read the clock */
    return (int64_t)(cs_mono() - beat) < 3000000000ll;
}

/* Set while a state dump (or its drain) writes: the program is paused for it anyway, so a
 * full ring is waited out while the recorder's process lives (its beat may lag while it
 * writes a big checkpoint), up to a minute without a beat, rather than losing state. */
CS_TLS int cs_patient;

static int cs_recorder_process_alive(void) {
    uint32_t pid = __atomic_load_n(&cs_ring->recorder_pid, __ATOMIC_RELAXED);
    if (!pid) return 0;
    uint64_t beat = __atomic_load_n(&cs_ring->recorder_beat_ns, __ATOMIC_RELAXED);
    if ((int64_t)(cs_mono() - beat) > 60000000000ll) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* A record that gets no ring space is counted, so the snapshot can say what it misses. */
static __attribute__((noinline, cold)) int cs_drop(uint32_t len) {
    __atomic_fetch_add(&cs_ring->dropped, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&cs_ring->dropped_bytes, len, __ATOMIC_RELAXED);
    return -1;
}

/* Reserve `len` bytes (multiple of 8). Waits while the ring is full and the recorder is
 * alive (a slow disk slows the program rather than losing data); drops otherwise. */
static int cs_reserve(cs_rec *r, uint32_t len, uint16_t type) {
    uint64_t cap = cs_mask + 1;
    if (len > cap / 2) return cs_drop(len);        /* larger than the ring can take: counted */
    unsigned spins = 0;
    for (;;) {
        uint64_t head = __atomic_load_n(&cs_ring->head, __ATOMIC_RELAXED);
        uint64_t off = head & cs_mask;
        uint64_t pad = (off + len > cap) ? cap - off : 0;
        uint64_t tail = __atomic_load_n(&cs_ring->tail, __ATOMIC_ACQUIRE);
        if (head + pad + len - tail > cap) {
            /* full: wait for a live recorder (a slow disk slows the program rather than
             * losing data); with no recorder draining, drop at once */
            if (!cs_recorder_alive() && !(cs_patient && cs_recorder_process_alive())) return cs_drop(len);
            if (++spins < 64) sched_yield(); else { struct timespec ts = {0, 200000}; nanosleep(&ts, NULL); }
            continue;
        }
        if (!__atomic_compare_exchange_n(&cs_ring->head, &head, head + pad + len, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        if (pad) {
            /* a pad may be as short as 8 bytes: write only len and state (its kind says pad:
             * the rest of a longer one is whatever an earlier lap left there) */
            uint32_t *ph = (uint32_t *)(cs_data + off);
            ph[0] = (uint32_t)pad;
            __atomic_store_n(&ph[1], CS_STATE(head, CS_PADDING), __ATOMIC_RELEASE);
            off = 0;
        }
        cs_rec_hdr *h = (cs_rec_hdr *)(cs_data + off);
        h->len = len; h->type = type; h->nfields = 0; h->fn = 0; h->seq = 0;
        h->tid = cs_thread(); h->t_ns = 0; h->result = 0; h->aux = 0;
        r->h = h; r->p = (char *)(h + 1); r->end = (char *)h + len; r->pos = head + pad;
        return 0;
    }
}

static inline void cs_publish(cs_rec *r) {
    /* Unused tail bytes become an empty trailing field-less gap: record len stays. */
    __atomic_store_n(&r->h->state, CS_STATE(r->pos, CS_PUBLISHED), __ATOMIC_RELEASE);
}

/* A launch's record: complete, its call not returned yet. */
static inline void cs_publish_inflight(cs_rec *r) {
    __atomic_store_n(&r->h->state, CS_STATE(r->pos, CS_INFLIGHT), __ATOMIC_RELEASE);
}

static inline uint32_t cs_flen(uint32_t n) { return (uint32_t)sizeof(cs_field_hdr) + ((n + 7u) & ~7u); }

static inline void cs_put(cs_rec *r, uint16_t idx, uint16_t tag, const void *src, uint32_t n) {
    cs_field_hdr *f = (cs_field_hdr *)r->p;
    f->idx = idx; f->tag = tag; f->len = n;
    if (n) memcpy(f + 1, src, n);
    r->p += cs_flen(n);
    r->h->nfields++;
}

static inline void cs_put_val(cs_rec *r, uint16_t idx, U v) { cs_put(r, idx, CS_T_VAL, &v, 8); }

#include "shim_blob.c"

static inline void cs_put_blobref(cs_rec *r, uint16_t idx, uint64_t serial, uint64_t size) {
    U v[2] = {serial, size};
    cs_put(r, idx, CS_T_BLOB, v, 16);
}

static void cs_note(const char *msg) {
    if (!cs_ring) return;
    uint32_t n = (uint32_t)strnlen(msg, 1024);
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(n), CS_REC_NOTE)) return;
    cs_put(&r, CS_F_MSG, CS_T_STR, msg, n);
    cs_publish(&r);
}

/* --- session start ------------------------------------------------------------------ */
static void cs_exit_hook(void);
static void cs_q_atfork_child(void);
static void cs_q_flush_all(void);
static void cs_nvtx_atfork_child(void);
static void cs_nvtx_ring_opened(void);
static void cs_win_init(void);

static void cs_atfork_child(void) {
    /* A forked child records into a ring of its own, made on its first driver call. */
    cs_ring = NULL; cs_data = NULL; cs_state = 0; cs_tid = 0;
    pthread_mutex_init(&cs_init_lock, NULL);
    cs_blob_atfork_child();
    cs_q_atfork_child();
    cs_nvtx_atfork_child();
}

static int cs_open_ring(void) {
    const char *dir = getenv("CUDASNAP_SESSION");
    if (!dir || !*dir) return -1;
    uint64_t mb = 256;
    const char *m = getenv("CUDASNAP_RING_MB");
    if (m && atoll(m) > 0) mb = (uint64_t)atoll(m);
    uint64_t cap = 1;
    while (cap < mb * (1ull << 20)) cap <<= 1;
    char path[4096], tmp[4096];
    pid_t pid = getpid();
    snprintf(path, sizeof path, "%s/ring-%d.shm", dir, (int)pid);
    snprintf(tmp, sizeof tmp, "%s/.ring-%d.tmp", dir, (int)pid);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    /* allocate the pages now: a tmpfs too small for the ring (a container's 64 MB /dev/shm)
     * must fail here (the process is then not recorded; `cudasnap capture` picks a session
     * directory with room), not as a SIGBUS in the program at its first record past it */
    if (posix_fallocate(fd, 0, (off_t)(CS_RING_HDR + cap)) != 0) { close(fd); unlink(tmp); return -1; }
    void *mem = mmap(NULL, CS_RING_HDR + cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) { unlink(tmp); return -1; }
    cs_ring_hdr *h = (cs_ring_hdr *)mem;
    memcpy(h->magic, CS_RING_MAGIC, 8);
    h->version = CS_RING_VERSION; h->hdr_size = CS_RING_HDR; h->capacity = cap;
    h->pid = (uint64_t)pid; h->ppid = (uint64_t)getppid();
    h->state = 1; h->start_ns = cs_mono(); h->fn_count = CS_NFN;
    cs_clock_tsc = cs_tsc_usable();
    h->clock = (uint32_t)cs_clock_tsc;
    cs_clock_pair(&h->clock_tsc0, &h->clock_ns0);
    snprintf(h->api_digest, sizeof h->api_digest, "%s", CS_API_DIGEST);
    cs_data = (char *)mem + CS_RING_HDR;
    cs_mask = cap - 1;
    __atomic_store_n(&cs_ring, h, __ATOMIC_RELEASE);
    rename(tmp, path);   /* the recorder sees only complete headers */
    return 0;
}

/* First driver call of this process: open the ring if a capture session asked for it. */
static int cs_start(void) {
    /* fast path: no syscall; a forked child was reset by cs_atfork_child */
    int st = __atomic_load_n(&cs_state, __ATOMIC_ACQUIRE);
    if (st != 0) return st;
    pid_t pid = getpid();
    pthread_mutex_lock(&cs_init_lock);
    if (cs_state == 0 || cs_pid != pid) {
        static int hooked;
        if (!hooked) { pthread_atfork(NULL, NULL, cs_atfork_child); atexit(cs_exit_hook); hooked = 1; }
        cs_pid = pid;
        int ok = cs_open_ring() == 0;
        __atomic_store_n(&cs_state, ok ? 1 : -1, __ATOMIC_RELEASE);
        if (ok) cs_win_init();             /* capture windows (shim_window.c) */
        if (ok) cs_nvtx_ring_opened();     /* NVTX events made before the first driver call */
    }
    pthread_mutex_unlock(&cs_init_lock);
    return cs_state;
}

static void cs_place_exit_note(void);
static U cs_drain_wait(void);

static void cs_exit_hook(void) {
    if (!cs_ring || cs_pid != getpid()) return;
    cs_drain_wait();                     /* a window's state still draining */
    cs_q_flush_all();
    cs_place_exit_note();
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr), CS_REC_EXIT) == 0) { r.h->t_ns = cs_now(); cs_publish(&r); }
    __atomic_store_n(&cs_ring->state, 2, __ATOMIC_RELEASE);
}

/* --- hooks: what a generic parameter table can't say ---------------------------------- */
#include "shim_hostmem.c"
#include "shim_hooks.c"
#include "shim_placement.c"
#include "shim_share.c"
#include "shim_placement_ipc.c"
#include "shim_window.c"
#include "shim_nvtx.c"

/* --- the generic call engine ------------------------------------------------------- */
/* which parameter kinds add fields before / after the call (most calls have none) */
#define CS_M(k) (1u << (k))
#define CS_M_PRE (CS_M(CS_K_IN_STRUCT) | CS_M(CS_K_INOUT_STRUCT) | CS_M(CS_K_STR) | CS_M(CS_K_BLOB_IN) | CS_M(CS_K_ARRAY_IN))
#define CS_M_POST (CS_M(CS_K_OUT) | CS_M(CS_K_OUT_STRUCT) | CS_M(CS_K_INOUT_STRUCT) | CS_M(CS_K_BLOB_OUT) | CS_M(CS_K_ARRAY_OUT))

static uint32_t cs_pre_size(const cs_fn *fn, const U *a, const cs_pre *pre) {
    uint32_t n = (uint32_t)sizeof(cs_rec_hdr) + cs_flen(8u * fn->nparams);
    if (fn->kinds & CS_M_PRE) for (int i = 0; i < fn->nparams; i++) {
        const cs_param *p = &fn->params[i];
        void *ptr = (p->flags & CS_P_BYVAL) ? (void *)&a[p->ai] : (void *)a[p->ai];
        switch (p->kind) {
        case CS_K_IN_STRUCT: case CS_K_INOUT_STRUCT:
            if (ptr) n += cs_flen(p->aux); break;
        case CS_K_STR:
            if (ptr) n += cs_flen((uint32_t)strnlen((const char *)ptr, 4096)); break;
        case CS_K_BLOB_IN: n += cs_flen(16); break;
        case CS_K_ARRAY_IN:
            if (ptr) n += cs_flen(cs_array_bytes(fn, p, a)); break;
        default: break;
        }
    }
    return n + cs_hook_pre_size(pre);
}

/* Every argument's value in one field (8 bytes each, in parameter order; a float argument
 * as the bits of a double). Integers are stored as passed: bits above an argument's C size
 * may be garbage (the ABI leaves them undefined) and the decoder masks them. */
static inline void cs_put_vals(cs_rec *r, const cs_fn *fn, const U *a, const double *d) {
    cs_field_hdr *vf = (cs_field_hdr *)r->p;
    vf->idx = CS_F_VALS; vf->tag = CS_T_VALS; vf->len = 8u * fn->nparams;
    U *vals = (U *)(vf + 1);
    if (!fn->floats) memcpy(vals, a, 8u * fn->nparams);     /* no float: argument i is a[i] */
    else for (int i = 0; i < fn->nparams; i++) {
        const cs_param *p = &fn->params[i];
        if (p->flags & CS_P_FLOAT) memcpy(&vals[i], &d[p->ai], 8);
        else vals[i] = a[p->ai];
    }
    r->p += cs_flen(8u * fn->nparams); r->h->nfields++;
}

/* --- pure queries ------------------------------------------------------------------- *
 * A pure query is called, then recorded as one CALL record. A repeat of this thread's last
 * recorded call of the same function with the same inputs, outputs and result (output
 * pointers may differ: call sites differ) is only counted (frameworks ask cuCtxGetDevice
 * several times per kernel). The counts go into one REPEAT record once the thread has made
 * CS_QBATCH more records, before a counted query's recorded call is replaced, at thread exit
 * and at process exit: a REPEAT record per launch cost as much as the launch record itself.
 * CUDASNAP_ALL_QUERIES=1 records every call. The cache is on the heap, reached through one
 * TLS pointer: the shim may be dlopen'ed too, where static TLS has little room. */
#define CS_QSLOTS 16
/* CS_QKEY (words of a query's identity: result, arguments, outputs) comes with the table */
#define CS_QBATCH 64                       /* records of the thread between REPEAT records */
typedef struct { int id; uint32_t len, count; uint64_t seq; U key[CS_QKEY]; } cs_qslot;
typedef struct cs_qcache {
    cs_qslot s[CS_QSLOTS];
    int pending;                           /* some slot has a count to write */
    int victim;                            /* next slot a new function takes */
    uint32_t since;                        /* records of this thread since counts were pending */
    uint8_t where[CS_NFN];                 /* API id -> its slot + 1 (0: none) */
    uint64_t tid;
    struct cs_qcache *prev, *next;         /* registry, for the exit hook */
} cs_qcache;
CS_TLS cs_qcache *cs_qc;
static cs_qcache *cs_qlist;
static pthread_mutex_t cs_qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t cs_qkey;
static pthread_once_t cs_qonce = PTHREAD_ONCE_INIT;
static int cs_qoff = -1;                   /* CUDASNAP_ALL_QUERIES, read once */

static void cs_q_flush(cs_qcache *q) {
    if (!q->pending || !cs_ring) return;
    q->pending = 0; q->since = 0;
    uint32_t n = 0;
    struct { uint32_t fn, count; uint64_t seq; } e[CS_QSLOTS];
    for (int i = 0; i < CS_QSLOTS; i++)
        if (q->s[i].count) {
            e[n].fn = (uint32_t)q->s[i].id; e[n].count = q->s[i].count; e[n].seq = q->s[i].seq;
            q->s[i].count = 0; n++;
        }
    cs_rec r;
    if (!n || cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(16u * n), CS_REC_REPEAT)) return;
    r.h->tid = q->tid; r.h->t_ns = cs_now();
    cs_put(&r, CS_F_REPEATS, CS_T_BYTES, e, 16u * n);
    cs_publish(&r);
}

static void cs_q_thread_exit(void *p) {
    cs_qcache *q = p;
    pthread_mutex_lock(&cs_qlock);
    cs_q_flush(q);
    if (q->prev) q->prev->next = q->next; else cs_qlist = q->next;
    if (q->next) q->next->prev = q->prev;
    pthread_mutex_unlock(&cs_qlock);
    if (cs_qc == q) cs_qc = NULL;
    free(q);
}

static void cs_q_key_init(void) { pthread_key_create(&cs_qkey, cs_q_thread_exit); }

static cs_qcache *cs_q_get(void) {
    if (cs_qc) return cs_qc;
    if (cs_qoff < 0) { const char *e = getenv("CUDASNAP_ALL_QUERIES"); cs_qoff = e && *e && *e != '0'; }
    if (cs_qoff) return NULL;
    cs_qcache *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    for (int i = 0; i < CS_QSLOTS; i++) q->s[i].id = -1;
    q->tid = cs_thread();
    pthread_once(&cs_qonce, cs_q_key_init);
    pthread_setspecific(cs_qkey, q);
    pthread_mutex_lock(&cs_qlock);
    q->next = cs_qlist; if (cs_qlist) cs_qlist->prev = q; cs_qlist = q;
    pthread_mutex_unlock(&cs_qlock);
    return cs_qc = q;
}

/* process exit: every thread's counts (other threads may still run: their counts as of now) */
static void cs_q_flush_all(void) {
    pthread_mutex_lock(&cs_qlock);
    for (cs_qcache *q = cs_qlist; q; q = q->next) cs_q_flush(q);
    pthread_mutex_unlock(&cs_qlock);
}

/* a forked child keeps only the forking thread, with nothing counted */
static void cs_q_atfork_child(void) {
    pthread_mutex_init(&cs_qlock, NULL);
    cs_qlist = NULL;
    if (cs_qc) {
        memset(cs_qc->s, 0, sizeof cs_qc->s);
        memset(cs_qc->where, 0, sizeof cs_qc->where);
        for (int i = 0; i < CS_QSLOTS; i++) cs_qc->s[i].id = -1;
        cs_qc->pending = 0; cs_qc->since = 0; cs_qc->prev = cs_qc->next = NULL;
        cs_qc->tid = cs_thread();                  /* cs_tid was reset: the child's id */
        cs_qlist = cs_qc;
    }
}

static inline void cs_q_before_record(void) {
    if (cs_qc && cs_qc->pending && ++cs_qc->since >= CS_QBATCH) cs_q_flush(cs_qc);
}

static inline int cs_is_out(const cs_param *p) {
    return p->kind == CS_K_OUT || p->kind == CS_K_OUT_STRUCT || p->kind == CS_K_INOUT_STRUCT;
}

/* The slot of this function in the thread's cache (a new function takes the slots in turn). */
static inline cs_qslot *cs_q_slot(cs_qcache *q, int id) {
    unsigned j = q->where[id];
    if (j && q->s[j - 1].id == id) return &q->s[j - 1];
    cs_qslot *slot = &q->s[q->victim];
    if (slot->count) cs_q_flush(q);                 /* its count must not be lost */
    if (slot->id >= 0) q->where[slot->id] = 0;
    q->where[id] = (uint8_t)(q->victim + 1);
    q->victim = (q->victim + 1) % CS_QSLOTS;
    slot->id = -1;
    return slot;
}

/* noinline: a query hit runs in this small frame, not in cs_call_rec's large one */
static __attribute__((noinline)) CUresult cs_call_query(int id, const cs_fn *fn, cs_gen_fn real, U *a, double *d) {
    cs_depth++;
    CUresult res = CS_CALL_REAL(fn, real, a, d);
    cs_depth--;
    if (fn->hook == CS_H_PLACE) cs_place_after(fn, a, res);   /* outputs as without placement */
    cs_qcache *q = cs_q_get();
    cs_qslot *slot = NULL;
    U key[CS_QKEY];
    /* the query's identity (result, inputs, outputs): generated per function (build_shim.py) */
    uint32_t kw = q && cs_qkeys[id] ? cs_qkeys[id](a, res, key) : 0;
    if (kw) {
        slot = cs_q_slot(q, id);
        if (slot->id == id && slot->len == kw && slot->count < 0x7fffffffu) {
            uint32_t i = 0;
            while (i < kw && slot->key[i] == key[i]) i++;
            if (i == kw) {
                slot->count++;
                q->pending = 1;
                return res;
            }
        }
    }
    if (slot && slot->count) cs_q_flush(q);          /* counts of the call this one replaces */
    cs_q_before_record();
    uint32_t n = (uint32_t)sizeof(cs_rec_hdr) + cs_flen(8u * fn->nparams);
    if (res == 0)
        for (int i = 0; i < fn->nparams; i++) {
            const cs_param *p = &fn->params[i];
            if (a[p->ai] && cs_is_out(p))
                n += cs_flen(p->aux);
        }
    cs_rec r;
    /* the number is taken whether or not the record fits: a dropped call leaves a gap */
    uint64_t seq = __atomic_fetch_add(&cs_ring->seq, 1, __ATOMIC_RELAXED);
    if (cs_reserve(&r, n, CS_REC_CALL) == 0) {
        r.h->fn = (uint32_t)id;
        r.h->seq = seq;
        r.h->t_ns = cs_now(); r.h->result = res; r.h->aux = res == 0;
        cs_put_vals(&r, fn, a, d);
        if (res == 0)
            for (int i = 0; i < fn->nparams; i++) {
                const cs_param *p = &fn->params[i];
                if (a[p->ai] && cs_is_out(p))
                    cs_put(&r, (uint16_t)i, CS_T_BYTES, (const void *)a[p->ai], p->aux);
            }
        cs_publish(&r);
        if (slot) { slot->id = id; slot->len = kw; slot->count = 0; slot->seq = seq; memcpy(slot->key, key, 8u * kw); }
    }
    return res;
}

static __attribute__((noinline)) CUresult cs_call_rec(int id, const cs_fn *fn, cs_gen_fn real, U *a, double *d);

/* Identify a function/kernel or context argument before the call; driver calls made while
 * identifying pass through unrecorded (a driver may route them through its own entry points). */
static __attribute__((noinline)) void cs_first_sight(const cs_fn *fn, const U *a) {
    cs_depth++;
    if (fn->fh >= 0 && a[fn->params[fn->fh].ai]) cs_layout_of(a[fn->params[fn->fh].ai]);
    if (fn->ch >= 0 && a[fn->params[fn->ch].ai]) cs_ctx_identify(a[fn->params[fn->ch].ai]);
    cs_depth--;
}

/* Every wrapper lands here: pass through, a pure query, or a recorded call. */
static CUresult cs_call(int id, U *a, double *d) {
    const cs_fn *fn = &cs_fns[id];
    cs_gen_fn real = REAL(id);
    if (!real) return 999; /* CUDA_ERROR_UNKNOWN: the driver lacks this entry */
    if (fn->hook == CS_H_EXPORT_TABLE || cs_depth || cs_start() != 1)
        return cs_hook_passthrough(fn, real, a, d);
    if ((fn->fh >= 0 && a[fn->params[fn->fh].ai]) || (fn->ch >= 0 && a[fn->params[fn->ch].ai]))
        cs_first_sight(fn, a);
    if (cs_win_mode) {          /* windows: state tracking and triggers around the call */
        uint64_t launch = cs_win_before(fn, id, a);
        CUresult res = fn->query ? cs_call_query(id, fn, real, a, d) : cs_call_rec(id, fn, real, a, d);
        cs_win_after(fn, id, a, res, launch);
        return res;
    }
    if (fn->query) return cs_call_query(id, fn, real, a, d);
    return cs_call_rec(id, fn, real, a, d);
}

static __attribute__((noinline)) CUresult cs_call_rec(int id, const cs_fn *fn, cs_gen_fn real, U *a, double *d) {
    cs_depth++;
    cs_q_before_record();

    /* blobs first, so the recorder has them when the call record arrives */
    uint64_t blob_serial[CS_MAXP];   /* not zero-filled: a rep stos here was 20% of the hot path */
    if (fn->kinds & CS_M(CS_K_BLOB_IN)) for (int i = 0; i < fn->nparams; i++) {
        const cs_param *p = &fn->params[i];
        blob_serial[i] = (p->kind == CS_K_BLOB_IN && a[p->ai] && !cs_win_skip)
            ? cs_blob((const void *)a[p->ai], a[fn->params[p->len_idx].ai]) : 0;
    }
    cs_pre pre;
    cs_hook_pre(fn, a, &pre);

    /* A launch is one CALL record, complete before the call and marked in flight (state 2),
     * finished in place after it: half the ring work of a PRE + POST pair. It returns at
     * once (no output): a record in flight holds the recorder back only for that long, and
     * one left in flight by a dying program is read as a call that never returned. */
    int inflight = fn->hook == CS_H_LAUNCH;
    uint64_t seq = __atomic_fetch_add(&cs_ring->seq, 1, __ATOMIC_RELAXED);
    cs_rec r;
    U *t1 = NULL;
    if (cs_reserve(&r, cs_pre_size(fn, a, &pre) + (inflight ? cs_flen(8) : 0), inflight ? CS_REC_CALL : CS_REC_PRE) == 0) {
        r.h->fn = (uint32_t)id; r.h->seq = seq; r.h->t_ns = cs_now();
        cs_put_vals(&r, fn, a, d);
        if (fn->kinds & CS_M_PRE) for (int i = 0; i < fn->nparams; i++) {
            const cs_param *p = &fn->params[i];
            if (p->flags & CS_P_FLOAT) continue;
            void *ptr = (p->flags & CS_P_BYVAL) ? (void *)&a[p->ai] : (void *)a[p->ai];
            switch (p->kind) {
            case CS_K_IN_STRUCT: case CS_K_INOUT_STRUCT:
                if (ptr) cs_put(&r, (uint16_t)i, CS_T_BYTES, ptr, p->aux); break;
            case CS_K_STR:
                if (ptr) cs_put(&r, (uint16_t)i, CS_T_STR, ptr, (uint32_t)strnlen((const char *)ptr, 4096)); break;
            case CS_K_BLOB_IN:
                /* outside a capture window no payload is sent: size 0 says so (not a loss) */
                cs_put_blobref(&r, (uint16_t)i, blob_serial[i], ptr && !cs_win_skip ? a[fn->params[p->len_idx].ai] : 0); break;
            case CS_K_ARRAY_IN:
                if (ptr) cs_put(&r, (uint16_t)i, CS_T_BYTES, ptr, cs_array_bytes(fn, p, a)); break;
            default: break;
            }
        }
        cs_hook_pre_fields(fn, &r, a, &pre);
        if (inflight) {
            cs_field_hdr *f = (cs_field_hdr *)r.p;
            f->idx = CS_F_T1; f->tag = CS_T_VAL; f->len = 8;
            t1 = (U *)(f + 1);
            r.p += cs_flen(8); r.h->nfields++;
            cs_publish_inflight(&r);
        } else cs_publish(&r);
    }

    CUresult res;
    if (!(fn->hook == CS_H_PLACE && cs_hook_replace(fn, a, &res)))
        res = CS_CALL_REAL(fn, real, a, d);

    cs_hook_after(fn, id, a, res);
    if (inflight) {
        if (t1) { *t1 = cs_now(); r.h->result = res; r.h->aux = res == 0; cs_publish(&r); }
        cs_depth--;
        return res;
    }
    /* output blobs (D2H results) */
    uint64_t out_serial[CS_MAXP];
    int keep_out = res == 0 && !cs_skip_out && !cs_win_skip;
    if (fn->kinds & CS_M(CS_K_BLOB_OUT)) for (int i = 0; i < fn->nparams; i++) {
        const cs_param *p = &fn->params[i];
        out_serial[i] = (keep_out && p->kind == CS_K_BLOB_OUT && a[p->ai])
            ? cs_blob((const void *)a[p->ai], a[fn->params[p->len_idx].ai]) : 0;
    }
    uint32_t n = (uint32_t)sizeof(cs_rec_hdr);
    int post = res == 0 && (fn->kinds & CS_M_POST);
    if (post) {
        for (int i = 0; i < fn->nparams; i++) {
            const cs_param *p = &fn->params[i];
            void *ptr = (void *)a[p->ai];
            if (!ptr) continue;
            switch (p->kind) {
            case CS_K_OUT: case CS_K_OUT_STRUCT: case CS_K_INOUT_STRUCT: n += cs_flen(p->aux); break;
            case CS_K_BLOB_OUT: if (out_serial[i]) n += cs_flen(16); break;
            case CS_K_ARRAY_OUT: n += cs_flen(cs_array_bytes(fn, p, a)); break;
            default: break;
            }
        }
    }
    n += cs_hook_post_size(fn, a, res);
    if (cs_reserve(&r, n, CS_REC_POST) == 0) {
        r.h->fn = (uint32_t)id; r.h->seq = seq; r.h->t_ns = cs_now(); r.h->result = res;
        r.h->aux = res == 0;
        if (post) {
            for (int i = 0; i < fn->nparams; i++) {
                const cs_param *p = &fn->params[i];
                void *ptr = (void *)a[p->ai];
                if (!ptr) continue;
                switch (p->kind) {
                case CS_K_OUT: case CS_K_OUT_STRUCT: case CS_K_INOUT_STRUCT:
                    cs_put(&r, (uint16_t)i, CS_T_BYTES, ptr, p->aux); break;
                case CS_K_BLOB_OUT:
                    if (out_serial[i]) cs_put_blobref(&r, (uint16_t)i, out_serial[i], a[fn->params[p->len_idx].ai]); break;
                case CS_K_ARRAY_OUT:
                    cs_put(&r, (uint16_t)i, CS_T_BYTES, ptr, cs_array_bytes(fn, p, a)); break;
                default: break;
                }
            }
        }
        cs_hook_post_fields(fn, &r, a, res);
        cs_publish(&r);
    }
    cs_depth--;
    return res;
}

/* --- dlsym: the way the CUDA runtime and frameworks reach the driver ----------------- */
static int cs_lookup(const char *name) {
    int lo = 0, hi = CS_NFN - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(cs_fns[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

/* Install `realp` as the real entry of `id`, and answer with our wrapper; a second,
 * different real pointer for the same id (never seen so far) is passed through. */
static int cs_is_ours(void *p) {
    static void *base;
    Dl_info me, it;
    if (!base && dladdr((void *)cs_call, &me)) base = me.dli_fbase;
    return base && dladdr(p, &it) && it.dli_fbase == base;
}

static void *cs_wrap(int id, void *realp) {
    if (!realp) return realp;
    if (cs_is_ours(realp)) {
        /* the driver's table resolved through our exported symbol (no -Bsymbolic):
         * the real entry is libcuda's own definition */
        void *h = cs_cuda_handle();
        realp = h ? cs_dlsym(h, cs_fns[id].name) : NULL;
        if (!realp || cs_is_ours(realp)) return cs_wrappers[id];
    }
    void *expected = NULL;
    if (!__atomic_compare_exchange_n(&cs_real[id], &expected, realp, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
        && expected != realp)
        return realp;
    return cs_wrappers[id];
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    void *p = cs_dlsym(handle, name);
    if (!p || !name || name[0] != 'c' || name[1] != 'u') return p;
    if (strcmp(name, "cuGetExportTable") == 0) return p;  /* untouched, no work: runtimes fetch private tables here, and work inside this hook has hung them */
    if (getenv("CUDASNAP_SESSION") == NULL) return p;
    int id = cs_lookup(name);
    if (id < 0) return p;
    if (!cs_libcuda && handle != RTLD_NEXT && handle != RTLD_DEFAULT) cs_libcuda = handle;
    return cs_wrap(id, p);
}

/* The recorder's calibration of TSC timestamps (cffi, in its own process): read a pair,
 * return its TSC; cs_shim_clock_ns gives its ns (integers only: a pointer argument would
 * make cffi reference Python data symbols, unresolvable where the shim is preloaded). */
static uint64_t cs_pair_ns;
uint64_t cs_shim_clock_pair(void) { uint64_t t; cs_clock_pair(&t, &cs_pair_ns); return t; }
uint64_t cs_shim_clock_ns(void) { return cs_pair_ns; }

/* Exported-symbol path (programs linked with -lcuda) lands directly in the wrappers,
 * which resolve the real entry lazily from libcuda. Python: report what we are. */
int cs_shim_fn_count(void) { return CS_NFN; }
const char *cs_shim_digest(void) { return CS_API_DIGEST; }
