/* cudasnap.formats._records: records frames read without a Python object per record.

A records frame's payload is concatenated msgpack maps (SCHEMA.md). rd_check validates a
whole payload (bounds, nesting, UTF-8, no ext types); rd_run then walks it record by record
in one of five modes:
  M_TEXT / M_JSON  the line `cudasnap dump` prints (cli/inspect_cmds.py _fmt_text, _json_line)
  M_SCAN           blob references per blob id (formats/blobrefs.py), blob records handed over
  M_SUMM           the counts formats/summary.py Summary keeps for call records
  M_KINDS          only the records of some kinds handed over (SnapshotReader.records(kinds))
  M_PLAN           the replay pre-scan's plain calls compiled into plan ops: replay/plan_walk.c,
                   compiled after this file into cudasnap.replay._plan (RD_PLAN defined)
Whatever a record holds that this code does not reproduce exactly (floats, non-string keys,
duplicate keys, non-ASCII text in quoted values, rare record kinds...) stops the walk with
RD_FALLBACK and the record's span: the Python layer handles that record, the reference.
Nothing here trusts the input: every read is bounds-checked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


enum { RD_DONE = 0, RD_FALLBACK = 1, RD_NEED = 2, RD_NOTE = 3, RD_SLOT = 4, RD_BLOB = 5, RD_CLOSE = 6, RD_LIMIT = 7,
       RD_NOMEM = -1 };
enum { M_TEXT, M_JSON, M_SCAN, M_SUMM, M_KINDS, M_PLAN };
enum { TAB_NAMES, TAB_BLOBS, TAB_FNS, TAB_REFS, TAB_HANDLES, NTAB };
#define NMEM 7
#define MAXDEPTH 64
#define MAXKEYS 64
#define NDUR 1024

typedef struct { uint8_t *key; uint32_t klen; int64_t v, v2; char *str; uint32_t slen; } ent;
typedef struct { ent *e; size_t n, cap; int32_t *idx; size_t icap; } tab;

/* the fields above "private" in rd and plout (and plmark whole) are what Python reads:
   build_records.py makes its cdef from them here */
typedef struct {
    char *out; size_t outlen;          /* lines made so far */
    size_t rec_end;                    /* RD_FALLBACK: end of the record handed over */
    const uint8_t *key; uint32_t keylen;   /* RD_NEED: the function name to classify */
    int note;                          /* RD_NOTE: 1 a new launch handle (hneg, hval), 2 a new memory kind */
    int hneg; uint64_t hval; int memk;
    int64_t idx;                       /* records of this payload done */
    int64_t n, nc, errors, unreturned, state_calls;   /* M_SUMM, since the last rd_take */
    uint64_t t0, t1; int has_t0, has_t1;
    int64_t mem_n[NMEM]; uint64_t mem_b[NMEM];
    /* private */
    size_t outcap;
    int mode, blobs, filter, errors_term, nranges;
    uint64_t *lo, *hi;
    const char **resnames;
    int seen_mem[NMEM];
    tab t[NTAB];
    struct durmemo { uint64_t dt; int len; char s[40]; } dur[NDUR];
    const uint8_t *base;
    struct plout *plan;                /* M_PLAN */
} rd;
typedef struct plout plout;
#ifdef RD_PLAN
static int plan_rec(rd *c, const uint8_t *p, const uint8_t *e);     /* replay/plan_walk.c */
static void pl_free_out(plout *o);
#endif

/* ------------------------------------------------------------------ tables */

static uint32_t hash(const uint8_t *p, size_t n) {
    uint32_t h = 2166136261u;
    while (n--) h = (h ^ *p++) * 16777619u;
    return h;
}

static ent *tab_find(tab *t, const uint8_t *k, size_t n) {
    if (!t->icap) return NULL;
    size_t m = t->icap - 1, i = hash(k, n) & m;
    for (; t->idx[i] >= 0; i = (i + 1) & m) {
        ent *e = &t->e[t->idx[i]];
        if (e->klen == n && memcmp(e->key, k, n) == 0) return e;
    }
    return NULL;
}

static ent *tab_add(tab *t, const uint8_t *k, size_t n) {
    ent *e = tab_find(t, k, n);
    if (e) return e;
    if ((t->n + 1) * 2 > t->icap) {
        size_t ic = t->icap ? t->icap * 2 : 64;
        int32_t *idx = malloc(ic * sizeof *idx);
        if (!idx) return NULL;
        memset(idx, 0xff, ic * sizeof *idx);
        for (size_t j = 0; j < t->n; j++) {
            size_t i = hash(t->e[j].key, t->e[j].klen) & (ic - 1);
            while (idx[i] >= 0) i = (i + 1) & (ic - 1);
            idx[i] = (int32_t)j;
        }
        free(t->idx);
        t->idx = idx, t->icap = ic;
    }
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 32;
        ent *ne = realloc(t->e, c * sizeof *ne);
        if (!ne) return NULL;
        t->e = ne, t->cap = c;
    }
    e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    if (!(e->key = malloc(n ? n : 1))) return NULL;
    memcpy(e->key, k, n);
    e->klen = (uint32_t)n;
    size_t i = hash(k, n) & (t->icap - 1);
    while (t->idx[i] >= 0) i = (i + 1) & (t->icap - 1);
    t->idx[i] = (int32_t)t->n++;
    return e;
}

static void tab_clear(tab *t) {
    for (size_t j = 0; j < t->n; j++) free(t->e[j].key), free(t->e[j].str);
    free(t->e), free(t->idx);
    memset(t, 0, sizeof *t);
}

/* an integer as a table key: sign byte + 8 bytes */
static void hkey(uint8_t k[9], int neg, uint64_t u) {
    k[0] = (uint8_t)neg;
    memcpy(k + 1, &u, 8);
}

/* ------------------------------------------------------------------ msgpack */

enum { T_NIL, T_BOOL, T_INT, T_FLT, T_STR, T_BIN, T_ARR, T_MAP, T_EXT };
typedef struct { int t, neg; uint64_t u; const uint8_t *s; uint32_t n; } mv;

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    while (n--) v = (v << 8) | *p++;
    return v;
}

/* one value's header (and the bytes of a str/bin/ext); 0, or -1 when it does not fit */
static int rdv(const uint8_t **pp, const uint8_t *e, mv *v) {
    const uint8_t *p = *pp;
    if (p >= e) return -1;
    uint8_t b = *p++;
    int hl = 0;
    v->neg = 0; v->u = 0; v->n = 0; v->s = NULL;
    if (b <= 0x7f) { v->t = T_INT; v->u = b; }
    else if (b >= 0xe0) { v->t = T_INT; v->neg = 1; v->u = (uint64_t)(-(int64_t)(int8_t)b); }
    else if (b <= 0x8f) { v->t = T_MAP; v->n = b & 15; }
    else if (b <= 0x9f) { v->t = T_ARR; v->n = b & 15; }
    else if (b <= 0xbf) { v->t = T_STR; v->n = b & 31; }
    else switch (b) {
    case 0xc0: v->t = T_NIL; break;
    case 0xc2: case 0xc3: v->t = T_BOOL; v->u = b & 1; break;
    case 0xc4: case 0xc5: case 0xc6: v->t = T_BIN; hl = 1 << (b - 0xc4); break;
    case 0xd9: case 0xda: case 0xdb: v->t = T_STR; hl = 1 << (b - 0xd9); break;
    case 0xca: case 0xcb: {
        int w = b == 0xca ? 4 : 8;
        if (e - p < w) return -1;
        v->t = T_FLT; p += w; break;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int w = 1 << (b - 0xcc);
        if (e - p < w) return -1;
        v->t = T_INT; v->u = be(p, w); p += w; break;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = 1 << (b - 0xd0);
        if (e - p < w) return -1;
        uint64_t u = be(p, w);
        int64_t s = w == 1 ? (int8_t)u : w == 2 ? (int16_t)u : w == 4 ? (int32_t)u : (int64_t)u;
        v->t = T_INT; v->neg = s < 0; v->u = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s; p += w; break;
    }
    case 0xdc: case 0xdd: v->t = T_ARR; hl = b == 0xdc ? 2 : 4; break;
    case 0xde: case 0xdf: v->t = T_MAP; hl = b == 0xde ? 2 : 4; break;
    default: v->t = T_EXT; return 0;     /* ext types and 0xc1: rd_check refuses them */
    }
    if (hl) {
        if (e - p < hl) return -1;
        v->n = (uint32_t)be(p, hl);
        p += hl;
    }
    if (v->t == T_STR || v->t == T_BIN) {
        if ((uint64_t)(e - p) < v->n) return -1;
        v->s = p;
        p += v->n;
    }
    if ((v->t == T_ARR || v->t == T_MAP) && (uint64_t)(e - p) < v->n) return -1;   /* >= 1 byte each */
    *pp = p;
    return 0;
}

static int utf8_ok(const uint8_t *s, uint32_t n) {
    for (uint32_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int k = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
        if (c < 0xc2 || c > 0xf4 || (uint64_t)i + k >= (uint64_t)n) return 0;
        uint32_t cp = c & (0x3f >> k);
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* skip one whole value; check: also refuse what the Python decoders would not give as plain
   data (ext types, container keys, invalid UTF-8) */
static int skip(const uint8_t **pp, const uint8_t *e, int depth, int check) {
    mv v;
    const uint8_t *p = *pp;
    if (p < e) {                         /* the common scalars without rdv */
        uint8_t b = *p;
        size_t w = b <= 0x7f || b >= 0xe0 || (b >= 0xc0 && b <= 0xc3 && b != 0xc1) ? 1
                 : b >= 0xcc && b <= 0xcf ? 1 + ((size_t)1 << (b - 0xcc))
                 : b >= 0xd0 && b <= 0xd3 ? 1 + ((size_t)1 << (b - 0xd0))
                 : b >= 0xa0 && b <= 0xbf ? 1 + (size_t)(b & 31) : 0;
        if (w) {
            if ((size_t)(e - p) < w) return -1;
            if (check && b >= 0xa0 && b <= 0xbf) {        /* fixstr: ASCII here, else the full check */
                uint8_t any = 0;
                for (size_t i = 1; i < w; i++) any |= p[i];
                if (any & 0x80 && !utf8_ok(p + 1, (uint32_t)w - 1)) return -1;
            }
            *pp = p + w;
            return 0;
        }
    }
    if (depth > MAXDEPTH || rdv(pp, e, &v) < 0 || v.t == T_EXT) return -1;
    if (check && v.t == T_STR && !utf8_ok(v.s, v.n)) return -1;
    if (v.t == T_ARR)
        for (uint32_t i = 0; i < v.n; i++)
            if (skip(pp, e, depth + 1, check) < 0) return -1;
    if (v.t == T_MAP)
        for (uint32_t i = 0; i < v.n; i++) {
            if (check && *pp < e && ((**pp >= 0x80 && **pp <= 0x9f) || (**pp >= 0xdc && **pp <= 0xdf))) return -1;
            if (skip(pp, e, depth + 1, check) < 0 || skip(pp, e, depth + 1, check) < 0) return -1;
        }
    return 0;
}

int rd_check(const uint8_t *p, size_t n, uint32_t count) {
    const uint8_t *e = p + n;
    for (uint32_t i = 0; i < count; i++) {
        if (p >= e || !((*p >= 0x80 && *p <= 0x8f) || *p == 0xde || *p == 0xdf)) return -1;
        if (skip(&p, e, 0, 1) < 0) return -1;
    }
    return p == e ? 0 : -1;
}

/* ------------------------------------------------------------------ output */

static int grow(rd *c, const void *s, size_t n) {
    {
        size_t cap = c->outcap ? c->outcap : 1 << 16;
        while (cap < c->outlen + n) cap *= 2;
        char *o = realloc(c->out, cap);
        if (!o) return RD_NOMEM;
        c->out = o, c->outcap = cap;
    }
    memcpy(c->out + c->outlen, s, n);
    c->outlen += n;
    return 0;
}

static inline int put(rd *c, const void *s, size_t n) {
    if (c->outlen + n > c->outcap) return grow(c, s, n);
    memcpy(c->out + c->outlen, s, n);
    c->outlen += n;
    return 0;
}
#define PUT(s, n) do { if (put(c, s, n)) return RD_NOMEM; } while (0)
#define PUTS(s) PUT(s, strlen(s))
#define TRY(x) do { int r_ = (x); if (r_) return r_; } while (0)

static int put_u(rd *c, uint64_t u, int hex) {
    static const char d2[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                             "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                             "8081828384858687888990919293949596979899";
    char b[24], *q = b + sizeof b;
    if (hex)
        do { *--q = "0123456789abcdef"[u & 15]; u >>= 4; } while (u);
    else {
        for (; u >= 100; u /= 100) q -= 2, memcpy(q, d2 + 2 * (u % 100), 2);
        if (u >= 10) q -= 2, memcpy(q, d2 + 2 * u, 2);
        else *--q = (char)('0' + u);
    }
    return put(c, q, (size_t)(b + sizeof b - q));
}

static int put_int(rd *c, const mv *v) {
    if (v->neg) PUT("-", 1);
    return put_u(c, v->u, 0);
}

/* s, the decimal u, then t */
static int put_sut(rd *c, const char *s, uint64_t u, const char *t) {
    PUTS(s);
    TRY(put_u(c, u, 0));
    PUTS(t);
    return 0;
}

static int put_hex(rd *c, const uint8_t *s, size_t n) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        char b[2] = {hx[s[i] >> 4], hx[s[i] & 15]};
        PUT(b, 2);
    }
    return 0;
}

/* json.dumps of a str (ensure_ascii) */
static int put_jstr(rd *c, const uint8_t *s, uint32_t n) {
    uint32_t i = 0;
    while (i < n && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\') i++;
    if (i == n && c->outlen + n + 2 <= c->outcap) {      /* nothing to escape (keys, names) */
        char *o = c->out + c->outlen;
        o[0] = '"';
        memcpy(o + 1, s, n);
        o[n + 1] = '"';
        c->outlen += n + 2;
        return 0;
    }
    PUT("\"", 1);
    for (uint32_t i = 0; i < n;) {
        uint8_t ch = s[i];
        uint32_t cp;
        char b[16];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
            uint32_t j = i;
            while (j < n && s[j] >= 0x20 && s[j] < 0x7f && s[j] != '"' && s[j] != '\\') j++;
            PUT(s + i, j - i);
            i = j;
            continue;
        }
        if (ch < 0x80) { cp = ch; i++; }
        else {
            int k = ch >= 0xf0 ? 3 : ch >= 0xe0 ? 2 : 1;
            if ((uint64_t)i + k >= (uint64_t)n) return RD_FALLBACK;   /* rd_check validated it */
            cp = ch & (0x3f >> k);
            for (int j = 1; j <= k; j++) cp = (cp << 6) | (s[i + j] & 0x3f);
            i += k + 1;
        }
        const char *esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r"
                        : cp == '\t' ? "\\t" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : NULL;
        if (esc) { PUTS(esc); continue; }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
        } else
            snprintf(b, sizeof b, "\\u%04x", cp);
        PUTS(b);
    }
    PUT("\"", 1);
    return 0;
}

static int ascii(const uint8_t *s, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (s[i] >= 0x80) return 0;
    return 1;
}

static int streq(const mv *v, const char *s) {
    if (v->t != T_STR) return 0;
    for (uint32_t i = 0; i < v->n; i++)
        if (s[i] != (char)v->s[i] || !s[i]) return 0;
    return s[v->n] == 0;
}

/* a map's keys: all str, none twice (what a Python dict keeps is then what msgpack holds).
   Finds the value of `want` (its start) when asked. */
static int map_keys(const uint8_t *p, const uint8_t *e, uint32_t n, const char *want, const uint8_t **found) {
    const uint8_t *ks[MAXKEYS];
    uint32_t kl[MAXKEYS];
    if (n > MAXKEYS) return RD_FALLBACK;
    if (found) *found = NULL;
    for (uint32_t i = 0; i < n; i++) {
        mv k;
        if (rdv(&p, e, &k) < 0 || k.t != T_STR) return RD_FALLBACK;
        for (uint32_t j = 0; j < i; j++)
            if (kl[j] == k.n && (!k.n || ks[j][0] == k.s[0]) && memcmp(ks[j], k.s, k.n) == 0) return RD_FALLBACK;
        ks[i] = k.s, kl[i] = k.n;
        if (want && streq(&k, want)) *found = p;
        if (skip(&p, e, 0, 0) < 0) return RD_FALLBACK;
    }
    return 0;
}

/* ------------------------------------------------------------------ text (_fmt_val) */

static int is_plain(const mv *v) {       /* str printed as is: ASCII alnum and _.:/- only */
    if (!v->n) return 0;
    for (uint32_t i = 0; i < v->n; i++) {
        uint8_t ch = v->s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || strchr("_.:/-", ch)) || !ch)
            return 0;
    }
    return 1;
}

static int fmt_val(rd *c, const uint8_t **pp, const uint8_t *e, int depth) {
    mv v;
    const uint8_t *start = *pp;
    if (rdv(pp, e, &v) < 0) return RD_FALLBACK;
    switch (v.t) {
    case T_NIL: PUT("-", 1); return 0;
    case T_BOOL: PUTS(v.u ? "true" : "false"); return 0;
    case T_INT:
        if (!v.neg && v.u > 0xFFFF) { PUT("0x", 2); return put_u(c, v.u, 1); }
        return put_int(c, &v);
    case T_STR:
        if (!ascii(v.s, v.n)) return RD_FALLBACK;
        if (is_plain(&v)) { PUT(v.s, v.n); return 0; }
        return put_jstr(c, v.s, v.n);
    case T_BIN: {
        size_t lim = c->blobs || v.n <= 32 ? v.n : 32;
        TRY(put_sut(c, "<", v.n, "B "));
        TRY(put_hex(c, v.s, lim));
        PUTS(lim < v.n ? "...>" : ">");
        return 0;
    }
    case T_ARR: case T_MAP:
        if (depth > 6) {
            *pp = start;
            if (skip(pp, e, 0, 0) < 0) return RD_FALLBACK;
            PUT("...", 3);
            return 0;
        }
        break;
    default: return RD_FALLBACK;
    }
    if (v.t == T_ARR) {
        PUT("[", 1);
        for (uint32_t i = 0; i < v.n; i++) {
            if (i < 16) {
                if (i) PUT(", ", 2);
                TRY(fmt_val(c, pp, e, depth + 1));
            } else if (skip(pp, e, 0, 0) < 0) return RD_FALLBACK;
        }
        if (v.n > 16) TRY(put_sut(c, ", ...", v.n - 16, " more"));
        PUT("]", 1);
        return 0;
    }
    const uint8_t *blob;
    TRY(map_keys(*pp, e, v.n, "blob", &blob));
    if (blob) {
        mv b;
        const uint8_t *q = blob;
        if (rdv(&q, e, &b) < 0) return RD_FALLBACK;
        if ((b.t == T_STR && v.n <= 2) || v.n == 1) {
            PUTS("blob:");
            if (b.t == T_STR) {
                uint32_t m = b.n < 12 ? b.n : 12;
                if (!ascii(b.s, m)) return RD_FALLBACK;
                PUT(b.s, m);
            } else if (b.t == T_INT) {
                char t[32];
                int m = snprintf(t, sizeof t, "%s%llu", b.neg ? "-" : "", (unsigned long long)b.u);
                PUT(t, m < 12 ? m : 12);
            } else if (b.t == T_NIL) PUTS("None");
            else if (b.t == T_BOOL) PUTS(b.u ? "True" : "False");
            else return RD_FALLBACK;
            *pp = start;
            return skip(pp, e, 0, 0) < 0 ? RD_FALLBACK : 0;
        }
    }
    PUT("{", 1);
    for (uint32_t i = 0; i < v.n; i++) {
        mv k;
        if (rdv(pp, e, &k) < 0) return RD_FALLBACK;
        if (i) PUT(", ", 2);
        PUT(k.s, k.n);
        PUT("=", 1);
        TRY(fmt_val(c, pp, e, depth + 1));
    }
    PUT("}", 1);
    return 0;
}

/* ------------------------------------------------------------------ json (_jsonable + dumps) */

static ent *blob_of(rd *c, const uint8_t *val, const uint8_t *e) {
    mv b;
    if (!val || rdv(&val, e, &b) < 0 || b.t != T_STR) return NULL;
    return tab_find(&c->t[TAB_BLOBS], b.s, b.n);
}

static int fmt_json(rd *c, const uint8_t **pp, const uint8_t *e, int depth);

/* a map's n entries as JSON ({...}), keys checked (all str, none twice); known: the blob
   the map names, whose size replaces a "size" value */
static int json_map(rd *c, const uint8_t **pp, const uint8_t *e, uint32_t n, int depth, ent *known,
                    const uint8_t **blob, int *has_size) {
    const uint8_t *ks[MAXKEYS];
    uint32_t kl[MAXKEYS];
    *blob = NULL, *has_size = 0;
    if (n > MAXKEYS) return RD_FALLBACK;
    PUT("{", 1);
    for (uint32_t i = 0; i < n; i++) {
        mv k;
        if (rdv(pp, e, &k) < 0 || k.t != T_STR) return RD_FALLBACK;
        for (uint32_t j = 0; j < i; j++)
            if (kl[j] == k.n && (!k.n || ks[j][0] == k.s[0]) && memcmp(ks[j], k.s, k.n) == 0) return RD_FALLBACK;
        ks[i] = k.s, kl[i] = k.n;
        if (i) PUT(",", 1);
        TRY(put_jstr(c, k.s, k.n));
        PUT(":", 1);
        if (k.n == 4 && streq(&k, "blob")) *blob = *pp;
        if (k.n == 4 && streq(&k, "size")) {
            *has_size = 1;
            if (known) {
                if (skip(pp, e, 0, 0) < 0) return RD_FALLBACK;
                TRY(put_u(c, (uint64_t)known->v, 0));
                continue;
            }
        }
        TRY(fmt_json(c, pp, e, depth + 1));
    }
    PUT("}", 1);
    return 0;
}

static int fmt_json(rd *c, const uint8_t **pp, const uint8_t *e, int depth) {
    mv v;
    const uint8_t *start = *pp;
    if (rdv(pp, e, &v) < 0) return RD_FALLBACK;
    if (v.t == T_BIN) {
        size_t lim = c->blobs || v.n <= 64 ? v.n : 64;
        PUTS("{\"hex\":\"");
        TRY(put_hex(c, v.s, lim));
        TRY(put_sut(c, "\",\"len\":", v.n, ""));
        PUTS(lim < v.n ? ",\"truncated\":true}" : "}");
        return 0;
    }
    if (depth > 32) {
        *pp = start;
        if (skip(pp, e, 0, 0) < 0) return RD_FALLBACK;
        PUTS("\"...\"");
        return 0;
    }
    switch (v.t) {
    case T_NIL: PUTS("null"); return 0;
    case T_BOOL: PUTS(v.u ? "true" : "false"); return 0;
    case T_INT: return put_int(c, &v);
    case T_STR: return put_jstr(c, v.s, v.n);
    case T_ARR:
        PUT("[", 1);
        for (uint32_t i = 0; i < v.n; i++) {
            if (i) PUT(",", 1);
            TRY(fmt_json(c, pp, e, depth + 1));
        }
        PUT("]", 1);
        return 0;
    case T_MAP: break;
    default: return RD_FALLBACK;
    }
    size_t mark = c->outlen;
    const uint8_t *body = *pp, *blob;
    int has_size;
    TRY(json_map(c, pp, e, v.n, depth, NULL, &blob, &has_size));
    ent *known = blob_of(c, blob, e);
    if (!known) return 0;
    if (c->blobs) return RD_FALLBACK;          /* a preview of the blob's data */
    c->outlen = mark, *pp = body;              /* again, with the blob's size */
    TRY(json_map(c, pp, e, v.n, depth, known, &blob, &has_size));
    if (!has_size) {
        c->outlen--;
        TRY(put_sut(c, ",\"size\":", (uint64_t)known->v, "}"));
    }
    return 0;
}

/* ------------------------------------------------------------------ records */

typedef struct { const uint8_t *k, *f, *a, *r, *s, *tid, *t0, *t1, *x, *state; } fields;

static const char *FIELDS[] = {"k", "f", "a", "r", "s", "tid", "t0", "t1", "x", "state"};

/* the record's map in one pass: keys all str and none twice, the fields found, its end */
static int fields_of(const uint8_t *p, const uint8_t *e, fields *fl, const uint8_t **end) {
    const uint8_t *ks[MAXKEYS];
    uint32_t kl[MAXKEYS];
    mv m;
    memset(fl, 0, sizeof *fl);
    if (rdv(&p, e, &m) < 0 || m.t != T_MAP || m.n > MAXKEYS) return RD_FALLBACK;
    for (uint32_t i = 0; i < m.n; i++) {
        mv k;
        if (rdv(&p, e, &k) < 0 || k.t != T_STR) return RD_FALLBACK;
        for (uint32_t j = 0; j < i; j++)
            if (kl[j] == k.n && (!k.n || ks[j][0] == k.s[0]) && memcmp(ks[j], k.s, k.n) == 0) return RD_FALLBACK;
        ks[i] = k.s, kl[i] = k.n;
        if (k.n <= 5)
            for (int j = 0; j < 10; j++)
                if (FIELDS[j][0] == (char)k.s[0] && streq(&k, FIELDS[j])) { ((const uint8_t **)fl)[j] = p; break; }
        if (skip(&p, e, 0, 0) < 0) return RD_FALLBACK;
    }
    *end = p;
    return 0;
}

/* the value at p (NULL: absent, read as nil) */
static mv val(const uint8_t *p, const uint8_t *e) {
    mv v = {T_NIL, 0, 0, NULL, 0};
    if (p && rdv(&p, e, &v) < 0) v.t = T_EXT;
    return v;
}

static int is_launch(const mv *f) {
    return f->n >= 8 && memcmp(f->s, "cuLaunch", 8) == 0 && !(f->n >= 16 && memcmp(f->s, "cuLaunchHostFunc", 16) == 0);
}

/* the launch's function handle a["f"] (an int), or RD_FALLBACK */
static int launch_handle(const uint8_t *a, const uint8_t *e, mv *h) {
    mv am = val(a, e);
    const uint8_t *hp;
    if (am.t != T_MAP) return RD_FALLBACK;
    rdv(&a, e, &am);
    TRY(map_keys(a, e, am.n, "f", &hp));
    *h = val(hp, e);
    return hp && h->t == T_INT ? 0 : RD_FALLBACK;
}

static ent *fn_of(rd *c, const mv *h) {
    uint8_t k[9];
    hkey(k, h->neg, h->u);
    return tab_find(&c->t[TAB_FNS], k, 9);
}

/* --calls: does the call match (SEL), not (0)? */
#define SEL 4
static int selected(rd *c, const fields *fl, const mv *f, const uint8_t *e) {
    ent *nm = tab_find(&c->t[TAB_NAMES], f->s, f->n);
    if (!nm) { c->key = f->s, c->keylen = f->n; return RD_NEED; }
    if (nm->v & 1) return SEL;                      /* a group or a name pattern */
    mv s = val(fl->s, e), r = val(fl->r, e);
    if (c->nranges) {
        if (s.t == T_FLT || s.t == T_BOOL || s.t == T_EXT) return RD_FALLBACK;
        if (s.t == T_INT && !s.neg)
            for (int i = 0; i < c->nranges; i++)
                if (s.u >= c->lo[i] && s.u <= c->hi[i]) return SEL;
    }
    if (c->errors_term) {
        if (r.t == T_NIL || (r.t == T_INT && r.u)) return SEL;
        if (r.t != T_INT) return RD_FALLBACK;
    }
    if (nm->v & 2) {                              /* a launch, and patterns on kernel names */
        mv h;
        TRY(launch_handle(fl->a, e, &h));
        ent *fn = fn_of(c, &h);
        if (fn && fn->slen && fn->v) return SEL;
    }
    return 0;
}

static int text_call(rd *c, const fields *fl, const mv *f, const uint8_t *e) {
    mv s = val(fl->s, e), tid = val(fl->tid, e), r = val(fl->r, e), t0 = val(fl->t0, e), t1 = val(fl->t1, e);
    mv id[2] = {s, tid};
    PUT("#", 1);
    for (int i = 0; i < 2; i++) {
        if (i) PUT("  ", 2);
        if (id[i].t == T_NIL || (id[i].t == T_STR && !id[i].n)) PUT("?", 1);
        else if (id[i].t == T_INT) TRY(put_int(c, &id[i]));
        else if (id[i].t == T_STR) PUT(id[i].s, id[i].n);
        else return RD_FALLBACK;
    }
    PUT("  ", 2);
    if (f->t == T_STR) PUT(f->s, f->n); else PUT("?", 1);
    PUT("(", 1);
    mv a = val(fl->a, e);
    const uint8_t *hp = NULL;
    if (a.t == T_MAP) {
        const uint8_t *p = fl->a, *ks[MAXKEYS];
        uint32_t kl[MAXKEYS];
        rdv(&p, e, &a);
        if (a.n > MAXKEYS) return RD_FALLBACK;
        for (uint32_t i = 0; i < a.n; i++) {
            mv k;
            if (rdv(&p, e, &k) < 0 || k.t != T_STR) return RD_FALLBACK;
            for (uint32_t j = 0; j < i; j++)
                if (kl[j] == k.n && (!k.n || ks[j][0] == k.s[0]) && memcmp(ks[j], k.s, k.n) == 0) return RD_FALLBACK;
            ks[i] = k.s, kl[i] = k.n;
            if (k.n == 1 && k.s[0] == 'f') hp = p;
            if (i) PUT(", ", 2);
            PUT(k.s, k.n);
            PUT("=", 1);
            TRY(fmt_val(c, &p, e, 0));
        }
    }
    PUT(") -> ", 5);
    if (r.t == T_NIL) PUTS("<never returned>");
    else if (r.t == T_INT) {
        const char *nm = !r.neg && r.u < 1000 ? c->resnames[r.u] : NULL;
        if (nm) PUTS(nm);
        else { PUTS("CUDA_ERROR_"); TRY(put_int(c, &r)); }
        PUT(" (", 2);
        TRY(put_int(c, &r));
        PUT(")", 1);
    } else return RD_FALLBACK;
    if (t0.t == T_INT && t1.t == T_INT && !t0.neg && !t1.neg && t1.u >= t0.u) {
        uint64_t dt = t1.u - t0.u;
        if (dt > (1ull << 53)) return RD_FALLBACK;
        struct durmemo *m = &c->dur[dt % NDUR];         /* durations repeat: each made once */
        if (!m->len || m->dt != dt) {
            double us = (double)dt / 1000;
            int n = us < 1000 ? snprintf(m->s, sizeof m->s, " [%.1f us]", us)
                              : snprintf(m->s, sizeof m->s, " [%.2f ms]", us / 1000);
            m->dt = dt, m->len = n > 0 && n < (int)sizeof m->s ? n : 0;
            if (!m->len) return RD_FALLBACK;
        }
        PUT(m->s, (size_t)m->len);
    }
    if (f->t == T_STR && is_launch(f) && a.t == T_MAP) {
        mv h = val(hp, e);
        if (!hp || h.t != T_INT) return RD_FALLBACK;
        ent *fn = fn_of(c, &h);
        if (fn && fn->slen) { PUTS("  kernel="); PUT(fn->str, fn->slen); }
    }
    mv x = val(fl->x, e);
    if (x.t == T_MAP && x.n) {
        const uint8_t *p = fl->x;
        rdv(&p, e, &x);
        TRY(map_keys(p, e, x.n, NULL, NULL));
        PUTS("  x={");
        for (uint32_t i = 0; i < x.n; i++) {
            mv k, b, v;
            rdv(&p, e, &k);
            if (i) PUT(", ", 2);
            PUT(k.s, k.n);
            PUT("=", 1);
            const uint8_t *q = p, *bp = NULL;
            if (rdv(&q, e, &v) < 0) return RD_FALLBACK;
            if (v.t == T_MAP) TRY(map_keys(q, e, v.n, "blob", &bp));
            b = val(bp, e);
            if (bp && b.t == T_STR) {
                ent *bl = tab_find(&c->t[TAB_BLOBS], b.s, b.n);
                uint32_t m = b.n < 12 ? b.n : 12;
                if ((bl && c->blobs) || !ascii(b.s, m)) return RD_FALLBACK;
                PUTS("blob:");
                PUT(b.s, m);
                if (bl) TRY(put_sut(c, "(", (uint64_t)bl->v, "B)")); else PUTS("(?B)");
                if (skip(&p, e, 0, 0) < 0) return RD_FALLBACK;
            } else
                TRY(fmt_val(c, &p, e, 0));
        }
        PUT("}", 1);
    }
    PUT("\n", 1);
    return 0;
}

/* M_SCAN: {"blob": str} maps inside a record's a and x */
static int scan_refs(rd *c, const uint8_t **pp, const uint8_t *e, int depth, int *budget) {
    mv v;
    if (--*budget < 0 || rdv(pp, e, &v) < 0) return RD_FALLBACK;
    if (v.t == T_ARR)
        for (uint32_t i = 0; i < v.n; i++) TRY(scan_refs(c, pp, e, depth + 1, budget));
    if (v.t != T_MAP) return 0;
    int nb = 0;
    for (uint32_t i = 0; i < v.n; i++) {
        mv k, b;
        if (rdv(pp, e, &k) < 0) return RD_FALLBACK;
        if (k.t == T_STR && streq(&k, "blob")) {
            const uint8_t *q = *pp;
            if (nb++ || rdv(&q, e, &b) < 0) return RD_FALLBACK;    /* "blob" twice: the reference decides */
            if (b.t == T_STR) {
                ent *r = tab_add(&c->t[TAB_REFS], b.s, b.n);
                if (!r) return RD_NOMEM;
                r->v2++;
            }
        }
        TRY(scan_refs(c, pp, e, depth + 1, budget));
    }
    return 0;
}

/* a[key] when it is a count (an int >= 0): 0; 1 when it is not; 2 when it is a huge one */
static int int_arg(const uint8_t *a, const uint8_t *e, const char *key, uint64_t *n) {
    mv am = val(a, e), v;
    const uint8_t *vp;
    if (am.t != T_MAP) return 1;
    rdv(&a, e, &am);
    if (map_keys(a, e, am.n, key, &vp)) return 1;
    v = val(vp, e);
    if (!vp || v.t != T_INT || v.neg) return 1;
    if (v.u >> 48) return 2;                      /* a count, too large to add up here */
    *n = v.u;
    return 0;
}

/* a is a map whose keys the walk can trust (all str, none twice) */
static int a_ok(const uint8_t *a, const uint8_t *e) {
    mv am = val(a, e);
    if (am.t != T_MAP) return RD_FALLBACK;
    rdv(&a, e, &am);
    return map_keys(a, e, am.n, NULL, NULL);
}

static const char *SIZE_KEYS[] = {"ByteCount", "byteCount", "bytes", "bytesize", "byteSize", "size", "Size",
                                  "N", "count", "Count"};

/* summary.copy_bytes when one of its size keys holds a count (else RD_FALLBACK) */
static int size_arg(const uint8_t *a, const uint8_t *e, uint64_t *n) {
    for (int i = 0; i < 10; i++) {
        int r = int_arg(a, e, SIZE_KEYS[i], n);
        if (r != 1) return r ? RD_FALLBACK : 0;
    }
    return RD_FALLBACK;
}

/* name classes set by the Python side (formats/native.py) */
enum { C_OTHER = 0, C_LAUNCH = 1, C_COPY = 10, C_MEMSET = 20, C_ALLOC = 30, C_PYTHON = 99 };

static int summ_call(rd *c, const fields *fl, const mv *f, const uint8_t *e) {
    if (f->t != T_STR) return RD_FALLBACK;
    ent *nm = tab_find(&c->t[TAB_NAMES], f->s, f->n);
    if (!nm) { c->key = f->s, c->keylen = f->n; return RD_NEED; }
    int cls = (int)nm->v, memk = -1;
    uint64_t bytes = 0;
    mv r = val(fl->r, e), st = val(fl->state, e), t0 = val(fl->t0, e), t1 = val(fl->t1, e), h;
    if (cls == C_PYTHON || !(r.t == T_NIL || r.t == T_INT) || !(st.t == T_NIL || st.t == T_BOOL)) return RD_FALLBACK;
    if (cls != C_OTHER) TRY(a_ok(fl->a, e));
    if (cls == C_LAUNCH) TRY(launch_handle(fl->a, e, &h));
    else if (cls >= C_COPY && cls < C_COPY + 4) {
        memk = cls - C_COPY;
        TRY(size_arg(fl->a, e, &bytes));
    } else if (cls > C_MEMSET && cls <= C_MEMSET + 4) {
        memk = 5;
        if (int_arg(fl->a, e, "N", &bytes)) return RD_FALLBACK;
        bytes *= (uint64_t)(cls - C_MEMSET);
    } else if (cls == C_ALLOC) {
        memk = 6;
        TRY(size_arg(fl->a, e, &bytes));
    } else if (cls != C_OTHER) return RD_FALLBACK;
    /* the record is counted: nothing below hands it over */
    c->n++, c->nc++;
    nm->v2++;
    if (t0.t == T_INT && !t0.neg && (!c->has_t0 || t0.u < c->t0)) c->t0 = t0.u, c->has_t0 = 1;
    if (t1.t == T_INT && !t1.neg && (!c->has_t1 || t1.u > c->t1)) c->t1 = t1.u, c->has_t1 = 1;
    if (st.t == T_BOOL && st.u) c->state_calls++;
    if (r.t == T_NIL) c->unreturned++;
    else if (r.u) c->errors++;
    if (cls == C_LAUNCH) {
        uint8_t k[9];
        hkey(k, h.neg, h.u);
        ent *he = tab_find(&c->t[TAB_HANDLES], k, 9);
        if (!he) {
            if (!(he = tab_add(&c->t[TAB_HANDLES], k, 9))) return RD_NOMEM;
            c->note = 1, c->hneg = h.neg, c->hval = h.u;
        }
        he->v2++;
    } else if (memk >= 0) {
        c->mem_n[memk]++, c->mem_b[memk] += bytes;
        if (!c->seen_mem[memk]) c->seen_mem[memk] = 1, c->note = 2, c->memk = memk;
    }
    return c->note ? RD_NOTE : 0;
}

/* ------------------------------------------------------------------ records */

static int record(rd *c, const uint8_t *p, const uint8_t *e) {
#ifdef RD_PLAN
    if (c->mode == M_PLAN) return plan_rec(c, p, e);
#else
    if (c->mode == M_PLAN) return RD_FALLBACK;      /* this build has no plan walk */
#endif
    fields fl;
    const uint8_t *end;
    TRY(fields_of(p, e, &fl, &end));
    c->rec_end = (size_t)(end - c->base);
    mv k = val(fl.k, e), f = val(fl.f, e);
    int call = streq(&k, "c");
    if (c->mode == M_SCAN) {
        if (streq(&k, "b")) return RD_FALLBACK;
        int budget = 5000;
        for (int i = 0; i < 2; i++) {
            const uint8_t *q = i ? fl.x : fl.a;
            if (q) TRY(scan_refs(c, &q, e, 0, &budget));
        }
        return 0;
    }
    if (c->mode == M_SUMM) return call ? summ_call(c, &fl, &f, e) : RD_FALLBACK;
    if (c->mode == M_KINDS)                           /* records of the kinds in TAB_NAMES */
        return k.t == T_STR && !tab_find(&c->t[TAB_NAMES], k.s, k.n) ? 0 : RD_FALLBACK;
    if (streq(&k, "fn")) return RD_FALLBACK;            /* the Python side keeps the names */
    if (c->filter) {
        if (!call) return 0;
        if (f.t != T_STR) return RD_FALLBACK;
        int sel = selected(c, &fl, &f, e);
        if (sel != SEL) return sel;
    }
    if (c->mode == M_JSON) {
        TRY(fmt_json(c, &p, e, 0));
        PUT("\n", 1);
        return 0;
    }
    return call ? text_call(c, &fl, &f, e) : RD_FALLBACK;
}

/* ------------------------------------------------------------------ API */

rd *rd_new(void) { return calloc(1, sizeof(rd)); }

void rd_free(rd *c) {
    if (!c) return;
    for (int i = 0; i < NTAB; i++) tab_clear(&c->t[i]);
#ifdef RD_PLAN
    if (c->plan) pl_free_out(c->plan), free(c->plan);
#endif
    free(c->out), free(c->lo), free(c->hi);
    free(c);
}

int rd_config(rd *c, int mode, int blobs, int filter, int errors_term, const uint64_t *lo, const uint64_t *hi,
              int nranges, const char **resnames) {
    c->mode = mode, c->blobs = blobs, c->filter = filter, c->errors_term = errors_term;
    c->resnames = resnames;
    free(c->lo), free(c->hi);
    c->lo = malloc((nranges + 1) * sizeof(uint64_t));
    c->hi = malloc((nranges + 1) * sizeof(uint64_t));
    if (!c->lo || !c->hi) return RD_NOMEM;
    memcpy(c->lo, lo, nranges * sizeof(uint64_t));
    memcpy(c->hi, hi, nranges * sizeof(uint64_t));
    c->nranges = nranges;
    return 0;
}

/* set an entry: v, and a string (fns: the kernel name) */
int rd_set(rd *c, int t, const uint8_t *key, size_t n, int64_t v, const char *s, size_t slen) {
    if (t < 0 || t >= NTAB) return RD_NOMEM;
    ent *x = tab_add(&c->t[t], key, n);
    if (!x) return RD_NOMEM;
    x->v = v;
    if (s) {
        free(x->str);
        if (!(x->str = malloc(slen ? slen : 1))) return RD_NOMEM;
        memcpy(x->str, s, slen);
        x->slen = (uint32_t)slen;
    }
    return 0;
}

int rd_set_fn(rd *c, int neg, uint64_t h, int64_t sel, const char *s, size_t slen) {
    uint8_t k[9];
    hkey(k, neg, h);
    return rd_set(c, TAB_FNS, k, 9, sel, s, slen);
}

/* entry i of table t (insertion order): 1, or 0 past the end */
int rd_entry(rd *c, int t, size_t i, const uint8_t **key, uint32_t *klen, int64_t *v2) {
    if (t < 0 || t >= NTAB || i >= c->t[t].n) return 0;
    *key = c->t[t].e[i].key, *klen = c->t[t].e[i].klen, *v2 = c->t[t].e[i].v2;
    return 1;
}

void rd_reset(rd *c, int t) { if (t >= 0 && t < NTAB) tab_clear(&c->t[t]); }

/* M_SUMM counters since the last call, then zeroed */
void rd_take(rd *c) {
    c->n = c->nc = c->errors = c->unreturned = c->state_calls = 0;
    c->has_t0 = c->has_t1 = 0;
    memset(c->mem_n, 0, sizeof c->mem_n);
    memset(c->mem_b, 0, sizeof c->mem_b);
}

/* walk records from *pos; returns at the payload's end or at the first record the caller
   must see (RD_FALLBACK: [*pos, rec_end); RD_NEED: classify key; RD_NOTE: after the record) */
int rd_run(rd *c, const uint8_t *buf, size_t n, size_t *pos) {
    const uint8_t *e = buf + n;
    if (*pos == 0) c->idx = 0;
    c->note = 0;
    c->base = buf;
    while (*pos < n) {
        const uint8_t *p = buf + *pos, *q = p;
        size_t mark = c->outlen;
        int r = record(c, p, e);
        if (r == RD_FALLBACK || r == RD_NEED || r == RD_NOMEM || r == RD_SLOT || r == RD_BLOB || r == RD_CLOSE) {
            c->outlen = mark;
            if (r == RD_FALLBACK) {              /* the record's end, when fields_of did not get there */
                if (skip(&q, e, 0, 0) < 0) q = e;
                c->rec_end = (size_t)(q - buf);
            }
            return r;
        }
        *pos = c->rec_end;
        c->idx++;
        if (r == RD_NOTE || r == RD_LIMIT) return r;
    }
    return RD_DONE;
}
