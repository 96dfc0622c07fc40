"""Build cudasnap.formats._records: the C reader of records frames (formats/records.c).

Optional: when it does not build, the package installs without it and every reader takes
the Python path (formats/native.py), with the same results. replay/build_plan.py compiles the
same file with the replay's plan walk (cudasnap.replay._plan) and reuses CDEF and _public."""
from __future__ import annotations

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "records.c")) as f:
    SOURCE = f.read()


def _public(opening: str, name: str, source: str = SOURCE) -> str:
    """The fields of a struct that Python reads, as a cdef typedef: from `opening` to its
    `/* private */` line (the rest is opaque to cffi)."""
    body = source[source.index(opening):]
    body = body[body.index("{") + 1:body.index("/* private */")]
    consts = dict(re.findall(r"#define (\w+) (\d+)\n", source))
    body = re.sub(r"\b(%s)\b" % "|".join(consts), lambda m: consts[m.group(1)], body)
    return f"typedef struct {{{body}    ...;\n}} {name};\n"


def _typedef(name: str, source: str = SOURCE) -> str:
    """A typedef Python reads whole (`typedef struct { ... } name;`)."""
    return re.search(r"typedef struct \{[^{}]*\} %s;" % name, source).group(0) + "\n"


# the structs come from records.c itself, so the two cannot drift apart
CDEF = _public("typedef struct {\n    char *out;", "rd") + """
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

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.formats._records", SOURCE, extra_compile_args=["-O2"], optional=True)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
