"""Build cudasnap.formats._records: the C reader of records frames (formats/records.c).

Optional: when it does not build, the package installs without it and every reader takes
the Python path (formats/native.py), with the same results."""
from __future__ import annotations

import os

from cffi import FFI

CDEF = """
typedef struct {
    char *out; size_t outlen;
    size_t rec_end;
    const uint8_t *key; uint32_t keylen;
    int note;
    int hneg; uint64_t hval; int memk;
    int64_t idx;
    int64_t n, nc, errors, unreturned, state_calls;
    uint64_t t0, t1; int has_t0, has_t1;
    int64_t mem_n[7]; uint64_t mem_b[7];
    ...;
} rd;

typedef struct { ...; } xop;

typedef struct {
    uint64_t addr; int seq_neg; uint64_t seq_u; int type; int h_neg; uint64_t h_u; uint64_t src; int32_t name;
} plmark;

typedef struct {
    int64_t n; uint8_t *kinds; xop *ops; uint16_t *fams;
    uint32_t *fr, *st, *en;
    int64_t calls, launches, skipped, d2h, d2h_bytes;
    int64_t nfam; int32_t *fam_id; int64_t *fam_n;
    int64_t nfuncs; uint8_t *fn_neg; uint64_t *fn_u; int64_t *fn_i;
    int64_t nsync; int64_t *sync_idx; int has_ctx_sync;
    int64_t nctx; int64_t *ctx_idx; int64_t ncopy; int64_t *copy_idx;
    int last_neg; uint64_t last_u;
    int64_t nmarks; plmark *marks; int64_t naddrs; uint64_t *addrs;
    int64_t *seqs; int seqs_ok;
    int pysumm;
    int tid_kind; int tid_neg; uint64_t tid_u;
    int64_t total; int has_max; int max_neg; uint64_t max_u; int has_wl; int wl_neg; uint64_t wl_u;
    int64_t nops, max_ops; int pace, has_origin, origin_neg; uint64_t origin_u;
    uint32_t frame; uint64_t scratch; int ranges_ok;
    int slot_ns;
    ...;
} plout;

rd *rd_new(void);
void rd_free(rd *c);
int rd_check(const uint8_t *p, size_t n, uint32_t count);
int rd_config(rd *c, int mode, int blobs, int filter, int errors_term, const uint64_t *lo, const uint64_t *hi,
              int nranges, const char **resnames);
int rd_set(rd *c, int t, const uint8_t *key, size_t n, int64_t v, const char *s, size_t slen);
int rd_set_fn(rd *c, int neg, uint64_t h, int64_t sel, const char *s, size_t slen);
int rd_entry(rd *c, int t, size_t i, const uint8_t **key, uint32_t *klen, int64_t *v2);
void rd_reset(rd *c, int t);
void rd_take(rd *c);
int rd_run(rd *c, const uint8_t *buf, size_t n, size_t *pos);
plout *pl_new(rd *c, int pace, uint64_t scratch);
int pl_close(rd *c);
xop *pl_take_ops(rd *c);
uint8_t *pl_take_arena(rd *c);
void pl_free(void *p);
void pl_reset(rd *c);
int pl_set_slot(rd *c, int ns, int neg, uint64_t u, int64_t idx);
int pl_set_blob(rd *c, const uint8_t *key, size_t klen, int64_t n, uint64_t ptr);
int pl_ranges(rd *c, const uint64_t *lo, const uint64_t *sz, int64_t n);
int pl_push(rd *c, const uint8_t *opb, int kind, int fam, int32_t name, int seq_neg, uint64_t seq_u,
            int h_neg, uint64_t h_u, int has_t0, int t0_neg, uint64_t t0_u);
"""

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "records.c")) as f:
    SOURCE = f.read()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.formats._records", SOURCE, extra_compile_args=["-O2"], optional=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
