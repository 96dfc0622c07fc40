"""Build cudasnap.formats._records: the C reader of records frames (formats/records.c).

Optional: when it does not build, the package installs without it and every reader takes
the Python path (formats/native.py), with the same results.  The replay plan's op kinds come
from formats/opkinds.py: this script writes them as opkinds.h into a directory of its own and
compiles records.c against it."""
from __future__ import annotations

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "records.c")) as f:
    SOURCE = f.read()


def _load_opkinds():
    """opkinds.py beside this script, loaded by path (the package is not importable while it builds)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cudasnap_opkinds_build", os.path.join(HERE, "opkinds.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _public(opening: str, name: str) -> str:
    """The fields of a records.c struct that Python reads, as a cdef typedef: from `opening`
    to its `/* private */` line (the rest is opaque to cffi)."""
    body = SOURCE[SOURCE.index(opening):]
    body = body[body.index("{") + 1:body.index("/* private */")]
    consts = dict(re.findall(r"#define (\w+) (\d+)\n", SOURCE))
    body = re.sub(r"\b(%s)\b" % "|".join(consts), lambda m: consts[m.group(1)], body)
    return f"typedef struct {{{body}    ...;\n}} {name};\n"


def _typedef(name: str) -> str:
    """A records.c typedef Python reads whole (`typedef struct { ... } name;`)."""
    return re.search(r"typedef struct \{[^{}]*\} %s;" % name, SOURCE).group(0) + "\n"


# the structs come from records.c itself, so the two cannot drift apart
CDEF = (_public("typedef struct {\n    char *out;", "rd") + "typedef struct { ...; } xop;\n" + _typedef("plmark")
        + _public("struct plout {", "plout") + """
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
""")

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.formats._records", SOURCE, extra_compile_args=["-O2"], optional=True,
                      include_dirs=[_load_opkinds().header_dir()])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
