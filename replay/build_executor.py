"""Build cudasnap.replay._executor: the replay engine's C executor (replay/executor.c).  It
runs a batch of compiled plain driver calls (replay/plan.py: launches, event record/wait,
memsets, D2D copies, synchronizations, context switches, skipped queries) in one call.

The op kinds come from formats/opkinds.py: this script writes them as opkinds.h into a
directory of its own and compiles executor.c against it; the op struct (ex_op) is in that header
too, and the cdef declares the same text, so nothing can drift apart."""
from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "executor.c")) as f:
    SOURCE = f.read()


def _load_opkinds():
    """formats/opkinds.py, loaded by path (the package is not importable while it builds)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cudasnap_opkinds_build",
                                                  os.path.join(HERE, os.pardir, "formats", "opkinds.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CDEF = _load_opkinds().ex_op_cdef() + """

int ex_init(int per_thread, char *err, int errlen);
int ex_has(int kind);
int64_t ex_run(const ex_op *ops, int64_t start, int64_t end, const uint64_t *slots, int *code,
               double *t_first, double *t_last, double *sync_t, int64_t sync_cap, int64_t *nsync,
               double pace_base);
int64_t ex_current(void);
int ex_host_func(uint64_t stream, int callback, int per_thread);
double ex_now(void);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source("cudasnap.replay._executor", SOURCE, libraries=["dl"],
                      include_dirs=[_load_opkinds().header_dir()])

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
