/* cudasnap.replay._executor: runs a batch of compiled plain driver calls (replay/plan.py) in
   one call; built by replay/build_executor.py, which generates opkinds.h (the op kinds, OP_*,
   from formats/opkinds.py) before it compiles this file.

   No CUDA toolkit is needed: the few driver types are declared here and each entry point is
   resolved at run time with dlopen("libcuda.so.1") + cuGetProcAddress_v2, with the version and
   flags cuda-bindings asks for, so it calls what the per-call (Python) path calls.

   Handles created during replay (streams, events, contexts, functions) are read through a slot
   table the Python side fills as the handlers create them: an op names a slot, or a literal
   value.  An op whose slot is still empty (or whose entry point is missing) stops the batch
   with EX_NEED_SLOW, and the engine replays that call through its handler. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "opkinds.h"

/* ex_op, one op of a plan: opkinds.h (the op fields of formats/opkinds.py) */

#define EX_NEED_SLOW (-1)
#define EX_MISMATCH (-2)

typedef int CUres;
typedef void *P;
typedef CUres (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

/* entry point per kind: name and the cudaVersion cuda-bindings asks cuGetProcAddress for */
static const struct { const char *name; int ver; } ex_names[OP_NKINDS] = OP_ENTRY_POINTS;
static void *ex_fn[OP_NKINDS];
static int ex_ready;
static volatile int64_t ex_pos;   /* op in progress (absolute index): for the watchdog */

typedef struct {                  /* CUlaunchConfig */
    unsigned grid[3], block[3], shmem;
    P stream;
    P attrs;
    unsigned nattrs;
} ex_cfg;

int64_t ex_current(void) { return ex_pos; }
int ex_has(int kind) { return kind == OP_SKIP || (kind > 0 && kind < OP_NKINDS && ex_fn[kind] != NULL); }

double ex_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);   /* what Python's time.monotonic() reads on Linux */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int ex_init(int per_thread, char *err, int errlen) {
    if (ex_ready) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) { snprintf(err, errlen, "dlopen libcuda.so.1: %s", dlerror()); return 1; }
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { snprintf(err, errlen, "libcuda.so.1 has no cuGetProcAddress_v2"); return 2; }
    for (int k = 1; k < OP_NKINDS; k++) {
        void *p = NULL;
        int status = 0;
        if (gpa(ex_names[k].name, &p, ex_names[k].ver, per_thread ? 2 : 0, &status) != 0) p = NULL;
        ex_fn[k] = p;      /* missing: ops of this kind take the per-call path */
    }
    if (!ex_fn[OP_LAUNCH]) { snprintf(err, errlen, "cuGetProcAddress_v2(cuLaunchKernel) failed"); return 3; }
    ex_ready = 1;
    return 0;
}

/* A recorded host function belongs to the recorded process and cannot run: these no-ops stand
   in for it, so the stream still waits at that point and a stream capture still gets its host
   node (the graph's nodes stay where they were recorded). */
static void ex_host_noop(void *user) { (void)user; }
static void ex_callback_noop(P stream, CUres status, void *user) { (void)stream; (void)status; (void)user; }

/* Enqueue the stand-in on a live stream: cuStreamAddCallback's form when callback, else
   cuLaunchHostFunc's. Returns the CUresult, or -1 when the driver has no such entry point. */
int ex_host_func(uint64_t stream, int callback, int per_thread) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    void *p = NULL;
    int status = 0;
    if (!gpa || gpa(callback ? "cuStreamAddCallback" : "cuLaunchHostFunc", &p, 12000, per_thread ? 2 : 0,
                    &status) != 0 || !p)
        return -1;
    if (callback)
        return ((CUres (*)(P, void (*)(P, CUres, void *), P, unsigned))p)((P)(uintptr_t)stream, ex_callback_noop,
                                                                          NULL, 0);
    return ((CUres (*)(P, void (*)(void *), P))p)((P)(uintptr_t)stream, ex_host_noop, NULL);
}

/* A ref: slot (>= 0; 0 in the table = not created yet) or literal. */
#define REF(r, out) do { if ((r) >= 0) { (out) = (P)(uintptr_t)slots[(r)]; if (!(out)) goto slow; } \
                         else (out) = (P)(uintptr_t)(uint64_t)(-((r) + 1)); } while (0)

/* Run ops[start, end) in order; stop at the first failing op.  Returns the index it stopped at
   (end when all ran); *code: its CUresult, EX_NEED_SLOW when the op must take the per-call
   path, or EX_MISMATCH when a D2H result differs from the recorded one.  *t_first / *t_last: CLOCK_MONOTONIC after the first and the last launch (left as
   they are when none ran); sync_t[*nsync++]: after each synchronization op. */
int64_t ex_run(const ex_op *ops, int64_t start, int64_t end, const uint64_t *slots, int *code,
               double *t_first, double *t_last, double *sync_t, int64_t sync_cap, int64_t *nsync,
               double pace_base) {
    *code = 0;
    int64_t i;
    for (i = start; i < end; i++) {
        const ex_op *o = &ops[i];
        ex_pos = i;
        if (pace_base > 0.0 && o->at > 0.0) {
            double due = pace_base + o->at;
            double now = ex_now();
            if (now < due) {
                /* sleep to 100 us before, then spin: nanosleep wakes tens of us late */
                double w = due - now - 100e-6;
                if (w > 0.0) {
                    struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
                    nanosleep(&ts, NULL);
                }
                while (ex_now() < due) {
                }
            }
        }
        int k = o->kind;
        if (k == 0) continue;
        void *fn = ex_fn[k];
        if (!fn) goto slow;
        P a, b, f;
        CUres r;
        switch (k) {
        case OP_LAUNCH: case OP_LAUNCH_EX: {
            REF(o->rf, f);
            REF(o->r0, a);
            size_t size = o->size;
            void *extra[5] = {(void *)1, (void *)(uintptr_t)o->params, (void *)2, &size, (void *)0};
            if (k == OP_LAUNCH) {
                r = ((CUres (*)(P, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, P, void **, void **))fn)(
                    f, o->grid[0], o->grid[1], o->grid[2], o->block[0], o->block[1], o->block[2], o->shmem, a,
                    NULL, size ? extra : NULL);
            } else {
                ex_cfg c = {{o->grid[0], o->grid[1], o->grid[2]}, {o->block[0], o->block[1], o->block[2]}, o->shmem,
                            a, (P)(uintptr_t)o->src, (unsigned)o->n};   /* value-only attributes, as recorded */
                r = ((CUres (*)(ex_cfg *, P, void **, void **))fn)(&c, f, NULL, size ? extra : NULL);
            }
            if (r == 0) {              /* launch timestamps: first and last, as the per-call path */
                double t = ex_now();
                if (*t_first == 0.0) *t_first = t;
                *t_last = t;
            }
            break;
        }
        case OP_EVENT_RECORD: REF(o->r0, a); REF(o->r1, b); r = ((CUres (*)(P, P))fn)(a, b); break;
        case OP_EVENT_RECORD_FLAGS: REF(o->r0, a); REF(o->r1, b); r = ((CUres (*)(P, P, unsigned))fn)(a, b, o->val); break;
        case OP_STREAM_WAIT: REF(o->r0, a); REF(o->r1, b); r = ((CUres (*)(P, P, unsigned))fn)(a, b, o->val); break;
        case OP_MEMSET8: r = ((CUres (*)(uint64_t, unsigned char, size_t))fn)(o->dst, (unsigned char)o->val, o->n); break;
        case OP_MEMSET16: r = ((CUres (*)(uint64_t, unsigned short, size_t))fn)(o->dst, (unsigned short)o->val, o->n); break;
        case OP_MEMSET32: r = ((CUres (*)(uint64_t, unsigned, size_t))fn)(o->dst, o->val, o->n); break;
        case OP_MEMSET8_ASYNC: REF(o->r0, a); r = ((CUres (*)(uint64_t, unsigned char, size_t, P))fn)(o->dst, (unsigned char)o->val, o->n, a); break;
        case OP_MEMSET16_ASYNC: REF(o->r0, a); r = ((CUres (*)(uint64_t, unsigned short, size_t, P))fn)(o->dst, (unsigned short)o->val, o->n, a); break;
        case OP_MEMSET32_ASYNC: REF(o->r0, a); r = ((CUres (*)(uint64_t, unsigned, size_t, P))fn)(o->dst, o->val, o->n, a); break;
        case OP_COPY_DTOD: case OP_COPY: r = ((CUres (*)(uint64_t, uint64_t, size_t))fn)(o->dst, o->src, o->n); break;
        case OP_COPY_DTOD_ASYNC: case OP_COPY_ASYNC:
            REF(o->r0, a); r = ((CUres (*)(uint64_t, uint64_t, size_t, P))fn)(o->dst, o->src, o->n, a); break;
        case OP_SYNC_STREAM: case OP_SYNC_EVENT: REF(o->r0, a); r = ((CUres (*)(P))fn)(a); goto synced;
        case OP_SYNC_CTX: r = ((CUres (*)(void))fn)(); goto synced;
        case OP_CTX_SET: case OP_CTX_PUSH: REF(o->r0, a); r = ((CUres (*)(P))fn)(a); break;
        case OP_CTX_POP: { P out = NULL; r = ((CUres (*)(P *))fn)(&out); break; }
        case OP_D2H:      /* into the scratch buffer (dst), compared with the expected bytes (params) */
            r = ((CUres (*)(P, uint64_t, size_t))fn)((P)(uintptr_t)o->dst, o->src, o->n);
            if (r == 0 && o->n && memcmp((const void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->params, o->n) != 0) {
                *code = EX_MISMATCH;       /* the handler copies again and reports it */
                return i;
            }
            break;
        default: goto slow;
        }
        if (r != 0) { *code = (int)r; break; }
        continue;
    synced:
        if (r != 0) { *code = (int)r; break; }
        if (*nsync < sync_cap) sync_t[(*nsync)++] = ex_now();
        continue;
    slow:
        *code = EX_NEED_SLOW;
        break;
    }
    return i;
}
