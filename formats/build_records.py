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
"""

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "records.c")) as f:
    SOURCE = f.read()

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.formats._records", SOURCE, extra_compile_args=["-O2"], optional=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
