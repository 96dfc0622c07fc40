"""Build cudasnap.replay._plan: the replay pre-scan's plan compiled in C (replay/plan_walk.c),
on the records walk of formats/records.c (compiled into the same unit with RD_PLAN defined).

Optional like the records reader: without it the engine compiles every batch with
replay/plan.py's Planner, the reference, with the same plan. The op kinds and the op struct
come from formats/opkinds.py (opkinds.h, as for the executor)."""
from __future__ import annotations

import importlib.util
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
FORMATS = os.path.join(HERE, os.pardir, "formats")


def _load(name: str, path: str):
    """A build script's module loaded by path (the package is not importable while it builds)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


records = _load("cudasnap_records_build", os.path.join(FORMATS, "build_records.py"))
opkinds = _load("cudasnap_opkinds_build", os.path.join(FORMATS, "opkinds.py"))
with open(os.path.join(HERE, "plan_walk.c")) as f:
    WALK = f.read()
SOURCE = "#define RD_PLAN 1\n" + records.SOURCE + "\n" + WALK

CDEF = (records.CDEF + "typedef struct { ...; } xop;\n" + records._typedef("plmark", SOURCE)
        + records._public("struct plout {", "plout", SOURCE) + """
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
ffibuilder.set_source("cudasnap.replay._plan", SOURCE, extra_compile_args=["-O2"], optional=True,
                      include_dirs=[opkinds.header_dir()])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
