/* cudasnap.formats._records: records frames read without a Python object per record.

A records frame's payload is concatenated msgpack maps (SCHEMA.md). rd_check validates a
whole payload (bounds, nesting, UTF-8, no ext types); rd_run then walks it record by record
in one of five modes:
  M_TEXT / M_JSON  the line `cudasnap dump` prints (cli/inspect_cmds.py _fmt_text, _json_line)
  M_SCAN           blob references per blob id (formats/blobrefs.py), blob records handed over
  M_SUMM           the counts formats/summary.py Summary keeps for call records
  M_KINDS          only the records of some kinds handed over (SnapshotReader.records(kinds))
  M_PLAN           the replay pre-scan's plain calls compiled into plan ops (replay/plan.py)
Whatever a record holds that this code does not reproduce exactly (floats, non-string keys,
duplicate keys, non-ASCII text in quoted values, rare record kinds...) stops the walk with
RD_FALLBACK and the record's span: the Python layer handles that record, the reference.
Nothing here trusts the input: every read is bounds-checked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opkinds.h"     /* the plan's op kinds (OP_*), generated from formats/opkinds.py */

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
    if (!streq(&k, "c")) {            /* the pre-scan reads these kinds; it passes over the others */
        if (k.t != T_STR) return 0;
        if (streq(&k, "fn") || streq(&k, "repair") || streq(&k, "ctx") || streq(&k, "region") || streq(&k, "note"))
            return RD_FALLBACK;
        return 0;
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

/* ------------------------------------------------------------------ records */

static int record(rd *c, const uint8_t *p, const uint8_t *e) {
    if (c->mode == M_PLAN) return plan_rec(c, p, e);
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
    if (c->plan) pl_free_out(c->plan), free(c->plan);
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
