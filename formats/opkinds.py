"""The replay plan's op kinds, written once.

A replay plan (replay/plan.py) compiles each plain driver call into an op of one of these
kinds; the C executor (replay/executor.c) runs ops by kind and the C plan compiler
(replay/plan_walk.c) writes them.  KINDS below is the only list: replay/plan.py takes its
constants from this module, and both C files include the header c_header() writes, which their
cffi build scripts (replay/build_executor.py, replay/build_plan.py) generate before they
compile.  The order is the numbering, and code on both sides relies on runs of it
(MEMSET8..MEMSET32_ASYNC: 8/16/32 bits, then the same with a stream; COPY_DTOD..COPY_ASYNC;
SYNC_STREAM..SYNC_CTX).

This module imports nothing from cudasnap: the build scripts load it by path, before the
package is installed."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

# name: the Python constant (and OP_<name> in C); entry point: the driver function the executor
# resolves; version: the cudaVersion cuda-bindings asks cuGetProcAddress for it; handler: the
# replay handler (replay/handlers/) that replays the call when the batch cannot.
#   name                  entry point                version handler
KINDS: Tuple[Tuple[str, Optional[str], int, Optional[str]], ...] = (
    ("SKIP",               None,                      0,     None),        # a skipped query
    ("LAUNCH",             "cuLaunchKernel",          4000,  "launch_kernel"),
    ("LAUNCH_EX",          "cuLaunchKernelEx",        11060, "launch_kernel_ex"),
    ("EVENT_RECORD",       "cuEventRecord",           2000,  "replay_plain"),
    ("EVENT_RECORD_FLAGS", "cuEventRecordWithFlags",  11010, "replay_plain"),
    ("STREAM_WAIT",        "cuStreamWaitEvent",       3020,  "replay_plain"),
    ("MEMSET8",            "cuMemsetD8",              3020,  "memset"),
    ("MEMSET16",           "cuMemsetD16",             3020,  "memset"),
    ("MEMSET32",           "cuMemsetD32",             3020,  "memset"),
    ("MEMSET8_ASYNC",      "cuMemsetD8Async",         3020,  "memset"),
    ("MEMSET16_ASYNC",     "cuMemsetD16Async",        3020,  "memset"),
    ("MEMSET32_ASYNC",     "cuMemsetD32Async",        3020,  "memset"),
    ("COPY_DTOD",          "cuMemcpyDtoD",            3020,  "memcpy_dtod"),
    ("COPY_DTOD_ASYNC",    "cuMemcpyDtoDAsync",       3020,  "memcpy_dtod"),
    ("COPY",               "cuMemcpy",                4000,  "memcpy_dtod"),
    ("COPY_ASYNC",         "cuMemcpyAsync",           4000,  "memcpy_dtod"),
    ("SYNC_STREAM",        "cuStreamSynchronize",     2000,  "replay_plain"),
    ("SYNC_EVENT",         "cuEventSynchronize",      2000,  "replay_plain"),
    ("SYNC_CTX",           "cuCtxSynchronize",        2000,  "ctx_sync"),
    ("CTX_SET",            "cuCtxSetCurrent",         4000,  "ctx_set_current"),
    ("CTX_PUSH",           "cuCtxPushCurrent",        4000,  "ctx_push"),
    ("D2H",                "cuMemcpyDtoH",            3020,  "memcpy_dtoh"),
    ("CTX_POP",            "cuCtxPopCurrent",         4000,  "ctx_pop"),
)
NKINDS = len(KINDS)
NAMES: Tuple[str, ...] = tuple(k[0] for k in KINDS)
# the kinds as module constants (SKIP = 0, LAUNCH = 1, ...): `from ...opkinds import LAUNCH`
globals().update({name: i for i, name in enumerate(NAMES)})

# One op of a plan, in order: field, C type, array length (0: a scalar), struct format
# (little-endian, LP64). The only description of the layout: c_header() writes it as ex_op for
# both C files, and replay/plan.py packs ops with OP_FORMAT.
OP_FIELDS: Tuple[Tuple[str, str, int, str], ...] = (
    ("kind", "uint16_t", 0, "H"),        # OP_*
    ("flags", "uint16_t", 0, "H"),
    ("val", "uint32_t", 0, "I"),         # memset value, event-record / wait flags
    ("r0", "int64_t", 0, "q"),           # handle refs: >= 0 slot index, < 0 literal value -(v + 1)
    ("r1", "int64_t", 0, "q"),
    ("rf", "int64_t", 0, "q"),
    ("dst", "uint64_t", 0, "Q"),         # memset / copy (live addresses)
    ("src", "uint64_t", 0, "Q"),
    ("n", "uint64_t", 0, "Q"),
    ("grid", "uint32_t", 3, "3I"),
    ("block", "uint32_t", 3, "3I"),
    ("shmem", "uint32_t", 0, "I"),
    ("pad", "uint32_t", 0, "4x"),        # the alignment of params
    ("params", "uint64_t", 0, "Q"),      # packed parameter bytes (the `extra` buffer form), a pointer
    ("size", "uint64_t", 0, "Q"),        # 0: no parameters, NULL extra
    ("at", "double", 0, "d"),            # --pace recorded: seconds after the recording's first call
)
OP_FORMAT = "<" + "".join(f[3] for f in OP_FIELDS)
OP_BYTES = 112                    # struct.calcsize(OP_FORMAT); the C side asserts it too

BATCH_MAX = 16384                 # ops per batch (watchdog and progress granularity)
D2H_MAX = 1 << 20                 # D2H verification in the executor: results up to this size


def by_handler() -> Dict[str, Dict[str, int]]:
    """handler function name -> {entry point (base name): kind} of the kinds it replays."""
    out: Dict[str, Dict[str, int]] = {}
    for i, (_name, entry, _ver, handler) in enumerate(KINDS):
        if handler is not None and entry is not None:
            out.setdefault(handler, {})[entry] = i
    return out


def c_header() -> str:
    """opkinds.h: the kinds as an enum of OP_<name>, OP_NKINDS, the batch limits and each kind's
    entry point (OP_ENTRY_POINTS, an initializer of {name, cudaVersion} per kind)."""
    width = max(map(len, NAMES)) + 3
    lines = ["/* opkinds.h: generated from formats/opkinds.py by the cffi build scripts; not to be edited.",
             "   The replay plan's op kinds, shared by replay/executor.c and replay/plan_walk.c. */",
             "#ifndef CUDASNAP_OPKINDS_H", "#define CUDASNAP_OPKINDS_H", "", "enum {"]
    lines += [f"    {'OP_' + name:<{width}} = {i}," for i, name in enumerate(NAMES)]
    lines += [f"    {'OP_NKINDS':<{width}} = {NKINDS}", "};", "",
              f"#define OP_BATCH_MAX {BATCH_MAX}", f"#define OP_D2H_MAX {D2H_MAX}", "",
              "/* per kind: the entry point and the cudaVersion cuda-bindings asks cuGetProcAddress for */",
              "#define OP_ENTRY_POINTS { \\"]
    for name, entry, ver, _h in KINDS:
        ep = "NULL" if entry is None else f'"{entry}"'
        lines.append(f"    {{{ep}, {ver}}},{' ' * max(1, 32 - len(ep) - len(str(ver)))}/* OP_{name} */ \\")
    lines += ["}", "", "#include <stdint.h>", "/* one op of a plan (OP_FIELDS): replay/plan.py packs it with OP_FORMAT */",
              ex_op_cdef(), f'_Static_assert(sizeof(ex_op) == {OP_BYTES}, "ex_op layout (formats/opkinds.py)");',
              "", "#endif", ""]
    return "\n".join(lines)


def ex_op_cdef() -> str:
    """The ex_op typedef, for opkinds.h and for the executor's cffi cdef."""
    body = "".join(f"    {ctype} {name}{f'[{n}]' if n else ''};\n" for name, ctype, n, _fmt in OP_FIELDS)
    return "typedef struct {\n" + body + "} ex_op;"


def header_dir() -> str:
    """A fresh directory holding opkinds.h, for a build script's include_dirs; it is removed
    when the process (the build) exits."""
    import atexit
    import os
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="cudasnap-opkinds-")
    atexit.register(shutil.rmtree, d, True)
    with open(os.path.join(d, "opkinds.h"), "w") as f:
        f.write(c_header())
    return d

