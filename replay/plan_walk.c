/* cudasnap.replay._plan's plan walk: the replay pre-scan's plain call records compiled into plan
ops in C, as replay/plan.py Planner compiles them (the reference; replay/plannative.py drives
this). replay/build_plan.py compiles formats/records.c (the bounds-checked msgpack walk) with
RD_PLAN defined, then this file, as one translation unit. */
#include "opkinds.h"     /* the plan's op kinds and ex_op (OP_*), generated from formats/opkinds.py */

/* ------------------------------------------------------------------ replay plan (M_PLAN) */

/* The replay pre-scan's plain calls compiled as replay/plan.py Planner._op and _close compile
   them (the reference): ops in the executor's ex_op layout, a batch's counters, index lists and
   write summary, with the record's span kept for decoding on demand. Any record whose op this
   code is not sure to reproduce is handed over (RD_FALLBACK), before any side effect: the
   Python planner then compiles it. Slots and expected D2H bytes come from Python (RD_SLOT,
   RD_BLOB), asked in the order the Python planner asks for them. */

typedef __int128 i128;
/* op kinds: OP_* of opkinds.h (formats/opkinds.py), included above */
/* a name's class (set by Python): kind | PL_PLAIN | PL_PTDS | PL_WORK | family << 16 */
#define PL_PLAIN 0x100
#define PL_PTDS 0x200
#define PL_WORK 0x400                  /* a --profiler-range workload call */

typedef ex_op xop;                     /* one op of a plan: opkinds.h (the op fields of formats/opkinds.py) */

/* key names -> index, by a small open hash (key lookups are most of a record's cost) */
typedef struct { const char **names; int nn; int8_t slot[128]; uint8_t len[32]; } ktab;

static unsigned kh(const uint8_t *s, uint32_t n) { return (n * 7u + s[0] * 3u + s[n - 1]) & 127u; }

static void kt_init(ktab *t, const char **names, int nn) {
    memset(t->slot, -1, sizeof t->slot);
    t->names = names, t->nn = nn;
    for (int j = 0; j < nn; j++) {
        uint32_t n = (uint32_t)strlen(names[j]);
        unsigned h = kh((const uint8_t *)names[j], n);
        while (t->slot[h] >= 0) h = (h + 1) & 127u;
        t->slot[h] = (int8_t)j, t->len[j] = (uint8_t)n;
    }
}

static int kt_find(const ktab *t, const uint8_t *s, uint32_t n) {
    if (!n || n > 255) return -1;
    for (unsigned h = kh(s, n); t->slot[h] >= 0; h = (h + 1) & 127u) {
        int j = t->slot[h];
        if (t->len[j] != n) continue;
        uint32_t i = 0;                        /* short keys: no memcmp call */
        while (i < n && t->names[j][i] == (char)s[i]) i++;
        if (i == n) return j;
    }
    return -1;
}

typedef struct { i128 seq, t0; uint64_t hu; uint32_t fr, st, en; int32_t name; uint16_t fam; uint8_t hneg, has_t0; } pside;

typedef struct {
    uint64_t addr; int seq_neg; uint64_t seq_u; int type; int h_neg; uint64_t h_u; uint64_t src; int32_t name;
} plmark;

struct plout {
    int64_t n; uint8_t *kinds; xop *ops; uint16_t *fams;
    uint32_t *fr, *st, *en;
    int64_t calls, launches, skipped, d2h, d2h_bytes;
    int64_t nfam; int32_t *fam_id; int64_t *fam_n;
    int64_t nfuncs; uint8_t *fn_neg; uint64_t *fn_u; int64_t *fn_i;
    int64_t nsync; int64_t *sync_idx; int has_ctx_sync;
    int64_t nctx; int64_t *ctx_idx; int64_t ncopy; int64_t *copy_idx;
    int last_neg; uint64_t last_u;
    int64_t nmarks; plmark *marks; int64_t naddrs; uint64_t *addrs;
    int64_t *seqs; int seqs_ok;        /* the ops' seqs, when all fit int64 */
    int pysumm;
    /* the open batch and the walk's counters (read and set by Python) */
    int tid_kind; int tid_neg; uint64_t tid_u;      /* tid_kind 0 None, 1 an int, 2 another value */
    int64_t total; int has_max; int max_neg; uint64_t max_u; int has_wl; int wl_neg; uint64_t wl_u;
    int64_t nops, max_ops; int pace, has_origin, origin_neg; uint64_t origin_u;
    uint32_t frame; uint64_t scratch; int ranges_ok;
    int slot_ns;
    /* private */
    size_t cap; pside *side;
    size_t opcap;
    uint8_t *arena; size_t alen;       /* the closed batch's launch parameters, 16-byte aligned */
    size_t mcap; size_t acap;
    uint64_t *rlo; uint64_t *rsz; int64_t nr;     /* recorded ranges: base, size (clamped) */
    tab st_h, st_f, blobs;
    ktab kt_top, kt_a, kt_params, kt_host, kt_dst, kt_blob;
};

static uint64_t *pl_u64grow(uint64_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return *p;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    uint64_t *q = realloc(*p, c * sizeof *q);
    if (!q) return NULL;
    *p = q, *cap = c;
    return q;
}

static void pl_free_out(plout *o) {
    free(o->kinds), free(o->ops), free(o->fams), free(o->fr), free(o->st), free(o->en);
    free(o->fam_id), free(o->fam_n), free(o->fn_neg), free(o->fn_u), free(o->fn_i);
    free(o->sync_idx), free(o->ctx_idx), free(o->copy_idx), free(o->marks), free(o->addrs), free(o->seqs);
    free(o->side), free(o->rlo), free(o->rsz), free(o->arena);
    tab_clear(&o->st_h), tab_clear(&o->st_f), tab_clear(&o->blobs);
}

/* room for one more op in the open batch */
static int pl_room(plout *o) {
    void *p;
    if ((size_t)o->n >= o->opcap) {          /* ops: handed to Python batch by batch (pl_take_ops) */
        size_t c = o->opcap ? o->opcap * 2 : OP_BATCH_MAX;   /* pages are touched as ops come */
        if (!(p = realloc(o->ops, c * sizeof(xop)))) return RD_NOMEM;
        o->ops = p, o->opcap = c;
    }
    if ((size_t)o->n < o->cap) return 0;
    size_t c = o->cap ? o->cap * 2 : 1024;
#define G(f, t) if (!(p = realloc(o->f, c * sizeof(t)))) return RD_NOMEM; o->f = p;
    G(kinds, uint8_t) G(fams, uint16_t) G(fr, uint32_t) G(st, uint32_t) G(en, uint32_t)
    G(side, pside) G(seqs, int64_t) G(sync_idx, int64_t) G(ctx_idx, int64_t) G(copy_idx, int64_t)
    G(fam_id, int32_t) G(fam_n, int64_t) G(fn_neg, uint8_t) G(fn_u, uint64_t) G(fn_i, int64_t)
#undef G
    o->cap = c;
    return 0;
}

static i128 mk128(int neg, uint64_t u) { return neg ? -(i128)u : (i128)u; }

/* the keys of a call's "a" this compiler reads */
enum { A_F, A_GX, A_GY, A_GZ, A_BX, A_BY, A_BZ, A_SHM, A_HSTREAM, A_HEVENT, A_FLAGS_L, A_FLAGS_U,
       A_DSTDEV, A_SRCDEV, A_UC, A_US, A_UI, A_N, A_DST, A_SRC, A_BYTES, A_CTX, A_CONFIG, A_NKEYS };
static const char *AKEYS[A_NKEYS] = {"f", "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY",
    "blockDimZ", "sharedMemBytes", "hStream", "hEvent", "flags", "Flags", "dstDevice", "srcDevice", "uc", "us",
    "ui", "N", "dst", "src", "ByteCount", "ctx", "config"};

/* a map's str keys, the values of those t names in got (NULL: absent); RD_FALLBACK where a key
   is not a str or one t names comes twice. nkeys: the map's size; known: how many t named;
   end: past the map */
static int pl_map2(const uint8_t *p, const uint8_t *e, const ktab *t, const uint8_t **got, uint32_t *nkeys,
                   uint32_t *known, const uint8_t **end, int subj, const ktab *st, const uint8_t **sgot, int *sok) {
    mv m;
    for (int j = 0; j < t->nn; j++) got[j] = NULL;
    if (!p || rdv(&p, e, &m) < 0 || m.t != T_MAP) return RD_FALLBACK;
    uint32_t nk = 0;
    for (uint32_t i = 0; i < m.n; i++) {
        mv k;
        if (p < e && *p >= 0xa0 && *p <= 0xbf) {      /* fixstr keys: the usual ones, read here */
            k.n = *p & 31u, k.s = p + 1;
            if ((size_t)(e - k.s) < k.n) return RD_FALLBACK;
            p = k.s + k.n;
        } else if (rdv(&p, e, &k) < 0 || k.t != T_STR)
            return RD_FALLBACK;
        int j = kt_find(t, k.s, k.n);
        if (j >= 0) {
            if (got[j]) return RD_FALLBACK;
            got[j] = p, nk++;
            if (j == subj) {                   /* that value's map read in the same pass */
                const uint8_t *q;
                if (pl_map2(p, e, st, sgot, NULL, NULL, &q, -1, NULL, NULL, NULL) == 0) {
                    *sok = 1, p = q;
                    continue;
                }
                *sok = 0;
            }
        }
        if (p < e && (*p <= 0x7f || *p == 0xc0 || *p == 0xc2 || *p == 0xc3)) { p++; continue; }   /* 1-byte values */
        if (skip(&p, e, 0, 0) < 0) return RD_FALLBACK;
    }
    if (nkeys) *nkeys = m.n;
    if (known) *known = nk;
    if (end) *end = p;
    return 0;
}

static int pl_map(const uint8_t *p, const uint8_t *e, const ktab *t, const uint8_t **got, uint32_t *nkeys,
                  uint32_t *known, const uint8_t **end) {
    return pl_map2(p, e, t, got, nkeys, known, end, -1, NULL, NULL, NULL);
}

/* an int argument: absent gives dflt (ok 1); present, an int: ok 1; else ok 0 */
typedef struct { int ok, neg; uint64_t u; } iv;
static iv pl_int(const uint8_t *p, const uint8_t *e, uint64_t dflt) {
    iv r = {1, 0, dflt};
    if (!p) return r;
    mv v = val(p, e);
    if (v.t != T_INT) { r.ok = 0; return r; }
    r.neg = v.neg, r.u = v.u;
    return r;
}
#define U32(x) ((x).ok && !(x).neg && (x).u <= 0xFFFFFFFFu)
#define U64(x) ((x).ok && !(x).neg)

static int pl_slot(rd *c, plout *o, int ns, int neg, uint64_t u, int64_t *out) {
    uint8_t k[9];
    hkey(k, neg, u);
    ent *x = tab_find(ns ? &o->st_f : &o->st_h, k, 9);
    if (!x) { o->slot_ns = ns, c->hneg = neg, c->hval = u; return RD_SLOT; }
    *out = x->v;
    return 0;
}

/* _stream_ref: a stream argument's executor ref; RD_FALLBACK where Python gives None */
static int pl_stream(rd *c, plout *o, int ptds, const uint8_t *hp, const uint8_t *e, int64_t *out) {
    mv v = val(hp, e);
    if (v.t == T_NIL || (v.t == T_INT && v.u == 0)) { *out = -((ptds ? 2 : 0) + 1); return 0; }
    if (v.t != T_INT) return RD_FALLBACK;
    if (!v.neg && (v.u == 1 || v.u == 2)) { *out = -(int64_t)(v.u + 1); return 0; }
    return pl_slot(c, o, 0, v.neg, v.u, out);
}

/* _handle_ref: RD_FALLBACK where Python gives None (not an int, or 0) */
static int pl_handle(rd *c, plout *o, const uint8_t *hp, const uint8_t *e, int64_t *out) {
    mv v = val(hp, e);
    if (v.t != T_INT || v.u == 0) return RD_FALLBACK;
    return pl_slot(c, o, 0, v.neg, v.u, out);
}

static const char *TOPKEYS[] = {"k", "s", "f", "a", "r", "tid", "t0", "t1", "x"};

static int plan_rec(rd *c, const uint8_t *p, const uint8_t *e) {
    plout *o = c->plan;
    const uint8_t *tk[9], *ak[A_NKEYS], *end;
    uint32_t nkeys, known;
    int aok = 0;
    TRY(pl_map2(p, e, &o->kt_top, tk, &nkeys, &known, &end, 3, &o->kt_a, ak, &aok));
    c->rec_end = (size_t)(end - c->base);
    mv k = val(tk[0], e);
    if (!streq(&k, "c")) {            /* the pre-scan reads every kind (the replay index keeps them) but blobs' */
        if (k.t != T_STR || streq(&k, "b")) return 0;
        return RD_FALLBACK;
    }
    if (known != nkeys) return RD_FALLBACK;        /* another key ("incomplete", "state"...): Python */
    if ((tk[3] && val(tk[3], e).t != T_MAP) || (tk[8] && val(tk[8], e).t != T_MAP))
        return RD_FALLBACK;                        /* arguments or extras not a map: Python skips it */
    mv s = val(tk[1], e), f = val(tk[2], e), r = val(tk[4], e), tid = val(tk[5], e), t0 = val(tk[6], e);
    if (f.t != T_STR || !tk[4] || s.t != T_INT) return RD_FALLBACK;
    ent *nm = tab_find(&c->t[TAB_NAMES], f.s, f.n);
    if (!nm) { c->key = f.s, c->keylen = f.n; return RD_NEED; }
    if (!(nm->v & PL_PLAIN)) return RD_FALLBACK;
    int kind = (int)(nm->v & 0xff), ptds = (nm->v & PL_PTDS) != 0;
    if (kind >= OP_NKINDS) return RD_FALLBACK;
    if ((nm->v & PL_WORK) && r.t != T_INT) return RD_FALLBACK;    /* r == 0 the Python way: 0.0, False */
    if (!(tid.t == T_NIL || tid.t == T_INT) || o->tid_kind == 2) return RD_FALLBACK;
    int has_t0 = 0;
    if (o->pace && tk[6]) {
        if (t0.t == T_INT) has_t0 = 1;
        else if (t0.t != T_NIL) return RD_FALLBACK;
    }
    xop op;
    memset(&op, 0, sizeof op);
    op.kind = (uint16_t)kind;
    uint64_t hu = 0;
    int hneg = 0;
    if (kind != OP_SKIP) {
        if (r.t != T_INT || r.u) return RD_FALLBACK;          /* a recorded error: its handler */
        if (!aok) return RD_FALLBACK;
    }
    int64_t x0 = 0, x1 = 0;
    switch (kind) {
    case OP_SKIP: case OP_SYNC_CTX: case OP_CTX_POP:
        break;
    case OP_LAUNCH: case OP_LAUNCH_EX: {
        const uint8_t *xk[2];
        uint32_t xn = 0, xknown = 0;
        if (pl_map(tk[8], e, &o->kt_params, xk, &xn, &xknown, NULL)) return RD_FALLBACK;
        if (xn != xknown) return RD_FALLBACK;      /* another extra (managed memory to upload): its handler */
        mv pv = val(xk[0], e), h = val(ak[A_F], e);
        if (pv.t != T_BIN || h.t != T_INT || !h.u) return RD_FALLBACK;
        iv d[7];
        uint64_t hs = 0;
        if (kind == OP_LAUNCH) {
            for (int i = 0; i < 7; i++) {
                d[i] = pl_int(ak[A_GX + i], e, i < 6 ? 1 : 0);
                if (!U32(d[i])) return RD_FALLBACK;
            }
        } else {                               /* CUlaunchConfig: 7 u32, pad, hStream, attrs, numAttrs */
            mv cf = val(ak[A_CONFIG], e);
            if (cf.t != T_BIN || cf.n < 56) return RD_FALLBACK;
            for (int i = 0; i < 7; i++) {
                uint32_t w;
                memcpy(&w, cf.s + 4 * i, 4);
                d[i] = (iv){1, 0, w};
            }
            memcpy(&hs, cf.s + 32, 8);
            uint32_t nattr;
            memcpy(&nattr, cf.s + 48, 4);
            if (nattr) {                       /* value-only attributes (plan.py _plain_attrs) */
                mv at = val(xk[1], e);
                if (at.t != T_BIN || (uint64_t)at.n < (uint64_t)nattr * 72) return RD_FALLBACK;
                for (uint32_t i = 0; i < nattr; i++) {
                    uint32_t id;
                    memcpy(&id, at.s + (size_t)i * 72, 4);
                    if (id > 14 || !((1u << id) & 0x4F7Cu)) return RD_FALLBACK;   /* 2-6, 8-11, 14 */
                }
                op.src = (uint64_t)(uintptr_t)at.s, op.n = nattr;
            }
        }
        if (kind == OP_LAUNCH) TRY(pl_stream(c, o, ptds, ak[A_HSTREAM], e, &x0));
        else if (!hs) x0 = -((ptds ? 2 : 0) + 1);
        else if (hs == 1 || hs == 2) x0 = -(int64_t)(hs + 1);
        else TRY(pl_slot(c, o, 0, 0, hs, &x0));
        TRY(pl_slot(c, o, 1, h.neg, h.u, &x1));
        op.r0 = x0, op.rf = x1;
        for (int i = 0; i < 3; i++) op.grid[i] = (uint32_t)d[i].u, op.block[i] = (uint32_t)d[3 + i].u;
        op.shmem = (uint32_t)d[6].u;
        if (pv.n) op.params = (uint64_t)(uintptr_t)pv.s, op.size = pv.n;
        hneg = h.neg, hu = h.u;
        break;
    }
    case OP_EVENT_RECORD: case OP_EVENT_RECORD_FLAGS: case OP_STREAM_WAIT: {
        iv fl = kind == OP_EVENT_RECORD ? (iv){1, 0, 0} : pl_int(ak[kind == OP_STREAM_WAIT ? A_FLAGS_U : A_FLAGS_L], e, 0);
        mv ev = val(ak[A_HEVENT], e), hs = val(ak[A_HSTREAM], e);
        if (ev.t != T_INT || !ev.u || !U32(fl)) return RD_FALLBACK;
        if (!(hs.t == T_NIL || hs.t == T_INT)) return RD_FALLBACK;
        TRY(pl_handle(c, o, ak[A_HEVENT], e, &x0));
        TRY(pl_stream(c, o, ptds, ak[A_HSTREAM], e, &x1));
        op.val = (uint32_t)fl.u;
        if (kind == OP_STREAM_WAIT) op.r0 = x1, op.r1 = x0;
        else op.r0 = x0, op.r1 = x1;
        break;
    }
    case OP_MEMSET8: case OP_MEMSET16: case OP_MEMSET32:
    case OP_MEMSET8_ASYNC: case OP_MEMSET16_ASYNC: case OP_MEMSET32_ASYNC: {
        int w = (kind - OP_MEMSET8) % 3;
        iv dst = pl_int(ak[A_DSTDEV], e, 0), v = pl_int(ak[A_UC + w], e, 0), n = pl_int(ak[A_N], e, 0);
        if (!ak[A_DSTDEV] || !U64(dst) || !U32(v) || !U64(n)) return RD_FALLBACK;
        if (kind >= OP_MEMSET8_ASYNC) TRY(pl_stream(c, o, ptds, ak[A_HSTREAM], e, &op.r0));
        op.val = (uint32_t)v.u, op.dst = dst.u, op.n = n.u;
        break;
    }
    case OP_COPY_DTOD: case OP_COPY_DTOD_ASYNC: case OP_COPY: case OP_COPY_ASYNC: {
        int ad = A_DSTDEV, as = A_SRCDEV;
        if (kind >= OP_COPY) {
            const uint8_t *xk[2];
            mv xv = val(tk[8], e);
            if (xv.t == T_MAP) {
                if (pl_map(tk[8], e, &o->kt_host, xk, NULL, NULL, NULL) || xk[0] || xk[1]) return RD_FALLBACK;
            } else if (xv.t != T_NIL) return RD_FALLBACK;
            ad = A_DST, as = A_SRC;
        }
        iv dst = pl_int(ak[ad], e, 0), src = pl_int(ak[as], e, 0), n = pl_int(ak[A_BYTES], e, 0);
        if (!ak[ad] || !ak[as] || !U64(dst) || !U64(src) || !U64(n)) return RD_FALLBACK;
        if (kind == OP_COPY_DTOD_ASYNC || kind == OP_COPY_ASYNC) TRY(pl_stream(c, o, ptds, ak[A_HSTREAM], e, &op.r0));
        op.dst = dst.u, op.src = src.u, op.n = n.u;
        break;
    }
    case OP_SYNC_STREAM:
        TRY(pl_stream(c, o, ptds, ak[A_HSTREAM], e, &op.r0));
        break;
    case OP_SYNC_EVENT:
        TRY(pl_handle(c, o, ak[A_HEVENT], e, &op.r0));
        break;
    case OP_CTX_SET: case OP_CTX_PUSH: {
        mv h = val(ak[A_CTX], e);
        if (h.t != T_INT) return RD_FALLBACK;
        if (h.u) TRY(pl_slot(c, o, 0, h.neg, h.u, &op.r0));
        else op.r0 = -1;
        break;
    }
    case OP_D2H: {
        const uint8_t *xk[1], *bk[1];
        if (!o->scratch || pl_map(tk[8], e, &o->kt_dst, xk, NULL, NULL, NULL) || !xk[0] ||
            pl_map(xk[0], e, &o->kt_blob, bk, NULL, NULL, NULL))
            return RD_FALLBACK;
        mv b = val(bk[0], e);
        iv src = pl_int(ak[A_SRCDEV], e, 0), n = pl_int(ak[A_BYTES], e, 0);
        if (b.t != T_STR || !ak[A_SRCDEV] || !U64(src) || !U64(n) || !n.u || n.u > OP_D2H_MAX) return RD_FALLBACK;
        ent *x = tab_find(&o->blobs, b.s, b.n);
        if (!x) { c->key = b.s, c->keylen = b.n; return RD_BLOB; }
        if (x->v < 0 || (uint64_t)x->v != n.u) return RD_FALLBACK;
        op.dst = o->scratch, op.src = src.u, op.n = n.u, op.params = (uint64_t)x->v2, op.size = n.u;
        break;
    }
    default:
        return RD_FALLBACK;
    }
    /* the op stands: the batch it joins */
    if (o->n && (o->n >= OP_BATCH_MAX || (tid.t == T_NIL ? o->tid_kind != 0
                 : o->tid_kind != 1 || o->tid_neg != tid.neg || o->tid_u != tid.u)))
        return RD_CLOSE;
    if (pl_room(o)) return RD_NOMEM;
    if (!o->n) o->tid_kind = tid.t == T_INT, o->tid_neg = tid.neg, o->tid_u = tid.u;
    int64_t i = o->n++;
    o->ops[i] = op;
    o->kinds[i] = (uint8_t)kind;
    o->fams[i] = (uint16_t)(nm->v >> 16);
    o->fr[i] = o->frame, o->st[i] = (uint32_t)(p - c->base), o->en[i] = (uint32_t)c->rec_end;
    pside *sd = &o->side[i];
    sd->seq = mk128(s.neg, s.u), sd->hu = hu, sd->hneg = (uint8_t)hneg;
    sd->name = (int32_t)(nm - c->t[TAB_NAMES].e), sd->fam = o->fams[i];
    sd->has_t0 = (uint8_t)has_t0, sd->t0 = has_t0 ? mk128(t0.neg, t0.u) : 0;
    if (has_t0 && !o->has_origin) o->has_origin = 1, o->origin_neg = t0.neg, o->origin_u = t0.u;
    o->total++;
    if (!o->has_max || sd->seq > mk128(o->max_neg, o->max_u)) o->has_max = 1, o->max_neg = s.neg, o->max_u = s.u;
    if ((nm->v & PL_WORK) && r.t == T_INT && !r.u) o->has_wl = 1, o->wl_neg = s.neg, o->wl_u = s.u;
    return ++o->nops > o->max_ops ? RD_LIMIT : 0;     /* Planner drops the plan past PLAN_MAX_OPS */
}

/* ------------------------------------------------------------------ closing a batch */

typedef struct { uint64_t key; int64_t at; } hslot;     /* open addressing: key -> entry index */
typedef struct { hslot *s; size_t cap, n; } hmap;

static int64_t *hm_get(hmap *h, uint64_t key, int add, int *fresh) {
    if (add && (h->n + 1) * 2 > h->cap) {
        size_t c = h->cap ? h->cap * 2 : 256;
        hslot *ns = malloc(c * sizeof *ns);
        if (!ns) return NULL;
        for (size_t i = 0; i < c; i++) ns[i].at = -1;
        for (size_t j = 0; j < h->cap; j++)
            if (h->s[j].at >= 0) {
                size_t i = (h->s[j].key * 0x9E3779B97F4A7C15ull) >> 20 & (c - 1);
                while (ns[i].at >= 0) i = (i + 1) & (c - 1);
                ns[i] = h->s[j];
            }
        free(h->s);
        h->s = ns, h->cap = c;
    }
    if (!h->cap) return NULL;
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> 20 & (h->cap - 1);
    for (; h->s[i].at >= 0; i = (i + 1) & (h->cap - 1))
        if (h->s[i].key == key) { if (fresh) *fresh = 0; return &h->s[i].at; }
    if (!add) return NULL;
    h->s[i].key = key, h->s[i].at = -2, h->n++;
    if (fresh) *fresh = 1;
    return &h->s[i].at;
}

/* Ranges.key: the recorded allocation holding addr (its base), else addr itself */
static uint64_t pl_key(plout *o, uint64_t a) {
    int64_t lo = 0, hi = o->nr;                  /* bisect_right(bases, a) - 1 */
    while (lo < hi) { int64_t mid = (lo + hi) / 2; if (o->rlo[mid] <= a) lo = mid + 1; else hi = mid; }
    if (lo > 0) {
        uint64_t b = o->rlo[lo - 1];
        i128 sz = o->rsz[lo - 1] ? (i128)o->rsz[lo - 1] : (i128)1 << 64;     /* 0: 2**64 or more */
        if ((i128)a < (i128)b + sz) return b;
    }
    return a;
}

typedef struct { uint64_t addr; i128 seq; int type; int hneg; uint64_t hu; uint64_t src; int32_t name; } wmark;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int pl_summarise(plout *o) {
    int64_t n = o->n, nm = 0, na = 0;
    size_t acap = 0;
    wmark *ms = NULL;
    uint64_t *ad = NULL;
    hmap last = {0}, seen = {0}, words = {0};
    int rc = RD_NOMEM;
    if (!(ms = malloc((size_t)(n + 1) * sizeof *ms))) goto out;
#define ADDR(v) do { int fr_; int64_t *s_ = hm_get(&seen, (v), 1, &fr_); if (!s_) goto out; \
        if (fr_) { *s_ = 0; if (!pl_u64grow(&ad, &acap, (size_t)na + 1)) goto out; ad[na++] = (v); } } while (0)
    /* last write per key, in first-write order; ms grows by one per new key */
#define MARK(key, mark) do { int fr_; int64_t *at_ = hm_get(&last, (key), 1, &fr_); if (!at_) goto out; \
        if (fr_) { if ((size_t)nm >= mcap) { mcap *= 2; if (!(grow = realloc(ms, mcap * sizeof *ms))) goto out; \
                                             ms = grow; } \
                   *at_ = nm++; } \
        ms[*at_] = (mark); } while (0)
    wmark *grow = NULL;
    size_t mcap = (size_t)n + 1;
    for (int64_t i = 0; i < n; i++) {
        int k = o->kinds[i];
        xop *op = &o->ops[i];
        pside *sd = &o->side[i];
        if (k < OP_LAUNCH || k == OP_EVENT_RECORD || k == OP_EVENT_RECORD_FLAGS || k == OP_STREAM_WAIT ||
            (k >= OP_SYNC_STREAM && k <= OP_CTX_PUSH) || k == OP_CTX_POP)
            continue;
        wmark w = {0};
        w.seq = sd->seq;
        if (k == OP_LAUNCH || k == OP_LAUNCH_EX) {
            const uint8_t *pp = (const uint8_t *)(uintptr_t)op->params;
            for (uint64_t off = 0; op->size >= 8 && off + 8 <= op->size; off += 8) {
                uint64_t v;
                int fw;
                memcpy(&v, pp + off, 8);             /* little-endian hosts only (the executor's too) */
                if (v < 0x10000) continue;
                int64_t *wi = hm_get(&words, v, 1, &fw);  /* a word twice in one launch: its first place */
                if (!wi) goto out;
                if (!fw && *wi == i) continue;
                *wi = i;
                ADDR(v);
                w.addr = v, w.type = 'k', w.hneg = sd->hneg, w.hu = sd->hu;
                MARK(pl_key(o, v), w);
            }
            continue;
        }
        if (k == OP_D2H) { ADDR(op->src); continue; }
        uint64_t dst = op->dst;
        if (k >= OP_MEMSET8 && k <= OP_MEMSET32_ASYNC) {
            ADDR(dst);
            w.addr = dst, w.type = 'n', w.name = sd->name;
        } else {                                     /* copies */
            uint64_t src = op->src;
            ADDR(src);
            ADDR(dst);
            int64_t *wp = hm_get(&last, pl_key(o, src), 0, NULL);
            w.addr = dst;
            if (!wp) w.type = 'c', w.src = src, w.name = sd->name;
            else {
                wmark *p = &ms[*wp];
                w.type = p->type, w.hneg = p->hneg, w.hu = p->hu, w.src = p->src, w.name = p->name;
            }
        }
        MARK(pl_key(o, dst), w);
    }
#undef ADDR
#undef MARK
    /* sorted(last.values(), key=seq): stable, so insertion sort on runs is fine for the
       mostly ordered input; fall back to a merge for the general case */
    {
        wmark *tmp = malloc((size_t)(nm + 1) * sizeof *tmp);
        if (!tmp) goto out;
        for (int64_t width = 1; width < nm; width *= 2) {
            for (int64_t lo = 0; lo < nm; lo += 2 * width) {
                int64_t mid = lo + width < nm ? lo + width : nm, hi = lo + 2 * width < nm ? lo + 2 * width : nm;
                int64_t a = lo, b = mid, t = lo;
                while (a < mid && b < hi) tmp[t++] = ms[b].seq < ms[a].seq ? ms[b++] : ms[a++];
                while (a < mid) tmp[t++] = ms[a++];
                while (b < hi) tmp[t++] = ms[b++];
            }
            memcpy(ms, tmp, (size_t)nm * sizeof *ms);
        }
        free(tmp);
    }
    free(o->marks);
    if (!(o->marks = malloc((size_t)(nm + 1) * sizeof(plmark)))) goto out;
    for (int64_t i = 0; i < nm; i++) {
        plmark *d = &o->marks[i];
        wmark *s = &ms[i];
        d->addr = s->addr, d->seq_neg = s->seq < 0, d->seq_u = (uint64_t)(s->seq < 0 ? -s->seq : s->seq);
        d->type = s->type, d->h_neg = s->hneg, d->h_u = s->hu, d->src = s->src, d->name = s->name;
    }
    o->nmarks = nm;
    if (na) qsort(ad, (size_t)na, sizeof *ad, cmp_u64);
    free(o->addrs);
    o->addrs = ad, o->naddrs = na, ad = NULL;
    rc = 0;
out:
    free(ms), free(ad), free(last.s), free(seen.s), free(words.s);
    return rc;
}

/* The batch's launch parameter bytes (and launch attributes) moved out of the frame into one
   array, each at a 16-byte boundary as the Python planner's bytes objects are: the driver gets
   them where a program's own buffer would be. Identical bytes are stored once. */
static uint64_t fnv64(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    while (n--) h = (h ^ *p++) * 1099511628211ull;
    return h;
}

static int pl_align(plout *o) {
    int64_t n = o->n;
    size_t cap = 0, len = 0;
    uint8_t *ar = NULL;
    hmap seen = {0};
    uint64_t *where = malloc((size_t)(2 * n + 1) * sizeof *where);   /* offset + 1 per op and field */
    int rc = RD_NOMEM;
    if (!where) return RD_NOMEM;
    for (int64_t i = 0; i < n; i++) {
        where[2 * i] = where[2 * i + 1] = 0;
        int k = o->kinds[i];
        if ((k != OP_LAUNCH && k != OP_LAUNCH_EX) || o->fr[i] == 0xFFFFFFFFu) continue;   /* Python's: aligned */
        for (int w = 0; w < 2; w++) {
            xop *op = &o->ops[i];
            const uint8_t *src = (const uint8_t *)(uintptr_t)(w ? op->src : op->params);
            size_t sz = w ? (k == OP_LAUNCH_EX && op->n ? (size_t)op->n * 72 : 0) : (size_t)op->size;
            if (!sz || !src) continue;
            int fresh;
            int64_t *at = hm_get(&seen, fnv64(src, sz) ^ sz, 1, &fresh);
            if (!at) goto out;
            if (!fresh) {
                uint64_t off = (uint64_t)*at;
                size_t olen;
                memcpy(&olen, ar + off - 16, sizeof olen);
                if (olen == sz && memcmp(ar + off, src, sz) == 0) { where[2 * i + w] = off + 1; continue; }
            }
            size_t need = len + 16 + ((sz + 15) & ~(size_t)15);    /* a length word, then the bytes */
            if (need > cap) {
                size_t c2 = cap ? cap * 2 : 4096;
                while (c2 < need) c2 *= 2;
                uint8_t *nb = realloc(ar, c2);
                if (!nb) goto out;
                ar = nb, cap = c2;
            }
            memcpy(ar + len, &sz, sizeof sz);
            memcpy(ar + len + 16, src, sz);
            *at = (int64_t)(len + 16);
            where[2 * i + w] = len + 16 + 1;
            len = need;
        }
    }
    /* malloc's 16-byte alignment holds for the final array; offsets are multiples of 16 */
    for (int64_t i = 0; i < n; i++) {
        if (where[2 * i]) o->ops[i].params = (uint64_t)(uintptr_t)(ar + where[2 * i] - 1);
        if (where[2 * i + 1]) o->ops[i].src = (uint64_t)(uintptr_t)(ar + where[2 * i + 1] - 1);
    }
    free(o->arena);
    o->arena = ar, o->alen = len, ar = NULL;
    rc = 0;
out:
    free(ar), free(where), free(seen.s);
    return rc;
}

/* the closed batch's parameter array (pl_align), the caller's to free (pl_free) */
uint8_t *pl_take_arena(rd *c) {
    uint8_t *p = c->plan->arena;
    c->plan->arena = NULL, c->plan->alen = 0;
    return p;
}

/* the open batch's counters, index lists and write summary (Planner._close); the ops' `at` */
int pl_close(rd *c) {
    plout *o = c->plan;
    int64_t n = o->n;
    o->calls = o->launches = o->skipped = o->d2h = o->d2h_bytes = 0;
    o->nfam = o->nfuncs = o->nsync = o->nctx = o->ncopy = o->nmarks = o->naddrs = 0;
    o->has_ctx_sync = 0, o->seqs_ok = 1;
    hmap fams = {0}, fns = {0};
    int rc = RD_NOMEM;
    i128 origin = mk128(o->origin_neg, o->origin_u);
    for (int64_t i = 0; i < n; i++) {
        int k = o->kinds[i], fr;
        pside *sd = &o->side[i];
        xop *op = &o->ops[i];
        op->at = 0.0;
        if (o->has_origin && sd->has_t0) {
            double at = (double)(sd->t0 - origin) * 1e-9;
            op->at = at > 0 ? at : 0.0;
        }
        if (sd->seq > INT64_MAX) o->seqs_ok = 0;
        else o->seqs[i] = (int64_t)sd->seq;
        if (k == OP_SKIP) { o->skipped++; continue; }
        o->calls++;
        int64_t *f = hm_get(&fams, sd->fam, 1, &fr);
        if (!f) goto out;
        if (fr) { *f = o->nfam; o->fam_id[o->nfam] = sd->fam; o->fam_n[o->nfam++] = 0; }
        o->fam_n[*f]++;
        if (k == OP_LAUNCH || k == OP_LAUNCH_EX) {
            o->launches++;
            /* handles as keys: sign folded into the hash key, the pair compared below */
            uint64_t hk = sd->hu ^ (sd->hneg ? 0xA5A5A5A5A5A5A5A5ull : 0);
            int64_t *h = hm_get(&fns, hk, 1, &fr);
            if (!h) goto out;
            if (!fr) {                               /* the same key: the same handle? */
                int64_t j = *h;
                if (o->fn_neg[j] == sd->hneg && o->fn_u[j] == sd->hu) continue;
                for (j = 0; j < o->nfuncs; j++)
                    if (o->fn_neg[j] == sd->hneg && o->fn_u[j] == sd->hu) break;
                if (j < o->nfuncs) continue;
            } else *h = o->nfuncs;
            o->fn_neg[o->nfuncs] = sd->hneg, o->fn_u[o->nfuncs] = sd->hu, o->fn_i[o->nfuncs++] = i;
        } else if (k == OP_D2H) {
            o->d2h++, o->d2h_bytes += (int64_t)op->n;
        } else if (k >= OP_SYNC_STREAM && k <= OP_SYNC_CTX) {
            o->sync_idx[o->nsync++] = i;
            if (k == OP_SYNC_CTX) o->has_ctx_sync = 1;
        } else if (k == OP_CTX_SET || k == OP_CTX_PUSH || k == OP_CTX_POP) {
            o->ctx_idx[o->nctx++] = i;
        } else if (k == OP_COPY || k == OP_COPY_ASYNC) {
            o->copy_idx[o->ncopy++] = i;
        }
    }
    if (n) {
        i128 s = o->side[n - 1].seq;
        o->last_neg = s < 0, o->last_u = (uint64_t)(s < 0 ? -s : s);
    }
    if (pl_align(o)) goto out;
    rc = o->pysumm || !o->ranges_ok ? 0 : pl_summarise(o);
out:
    free(fams.s), free(fns.s);
    return rc;
}

/* the closed batch's ops, the caller's to free (pl_free); the next batch gets a new array */
xop *pl_take_ops(rd *c) {
    plout *o = c->plan;
    xop *p = o->ops, *q = o->n ? realloc(p, (size_t)o->n * sizeof(xop)) : NULL;
    o->ops = NULL, o->opcap = 0;
    if (q) return q;
    if (!o->n) free(p);
    return o->n ? p : NULL;
}

void pl_free(void *p) { free(p); }

/* a new batch opens with the next op */
void pl_reset(rd *c) {
    plout *o = c->plan;
    o->n = 0, o->tid_kind = 0, o->pysumm = 0;
}

plout *pl_new(rd *c, int pace, uint64_t scratch) {
    if (c->plan) return c->plan;
    plout *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    static const char *PK[] = {"params", "attrs"}, *HK[] = {"hostsrc", "hostdst"}, *DK[] = {"dstHost"}, *BK[] = {"blob"};
    o->pace = pace, o->scratch = scratch, o->ranges_ok = 1, o->max_ops = INT64_MAX;
    kt_init(&o->kt_top, TOPKEYS, 9), kt_init(&o->kt_a, AKEYS, A_NKEYS), kt_init(&o->kt_params, PK, 2);
    kt_init(&o->kt_host, HK, 2), kt_init(&o->kt_dst, DK, 1), kt_init(&o->kt_blob, BK, 1);
    c->plan = o, c->mode = M_PLAN;
    return o;
}

int pl_set_slot(rd *c, int ns, int neg, uint64_t u, int64_t idx) {
    uint8_t k[9];
    hkey(k, neg, u);
    ent *x = tab_add(ns ? &c->plan->st_f : &c->plan->st_h, k, 9);
    if (!x) return RD_NOMEM;
    x->v = idx;
    return 0;
}

/* expected D2H bytes of a blob id: n < 0 none; else n bytes at ptr (kept alive by Python) */
int pl_set_blob(rd *c, const uint8_t *key, size_t klen, int64_t n, uint64_t ptr) {
    ent *x = tab_add(&c->plan->blobs, key, klen);
    if (!x) return RD_NOMEM;
    x->v = n, x->v2 = (int64_t)ptr;
    return 0;
}

/* the recorded allocation ranges (bases sorted ascending); sizes already max(size, 1) and
   clamped to 2**64 - 1 + 1 by the caller's flag: a size of 0 here stands for 2**64 */
int pl_ranges(rd *c, const uint64_t *lo, const uint64_t *sz, int64_t n) {
    plout *o = c->plan;
    free(o->rlo), free(o->rsz);
    o->rlo = malloc((size_t)(n + 1) * 8), o->rsz = malloc((size_t)(n + 1) * 8);
    if (!o->rlo || !o->rsz) return RD_NOMEM;
    memcpy(o->rlo, lo, (size_t)n * 8), memcpy(o->rsz, sz, (size_t)n * 8);
    o->nr = n;
    return 0;
}

/* an op the Python planner compiled (a record handed over): joins the open batch */
int pl_push(rd *c, const uint8_t *opb, int kind, int fam, int32_t name, int seq_neg, uint64_t seq_u,
            int h_neg, uint64_t h_u, int has_t0, int t0_neg, uint64_t t0_u) {
    plout *o = c->plan;
    if (pl_room(o)) return RD_NOMEM;
    int64_t i = o->n++;
    memcpy(&o->ops[i], opb, sizeof(xop));
    o->kinds[i] = (uint8_t)kind, o->fams[i] = (uint16_t)fam;
    o->fr[i] = 0xFFFFFFFFu, o->st[i] = o->en[i] = 0;
    pside *sd = &o->side[i];
    sd->seq = mk128(seq_neg, seq_u), sd->hneg = (uint8_t)h_neg, sd->hu = h_u, sd->name = name, sd->fam = (uint16_t)fam;
    sd->has_t0 = (uint8_t)has_t0, sd->t0 = has_t0 ? mk128(t0_neg, t0_u) : 0;
    o->nops++;
    return 0;
}
