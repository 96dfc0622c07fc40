"""`cudasnap export SNAP -o DIR --sim`: a standalone C program that replays the snapshot on
GPGPU-Sim and verifies it, for a simulator team to build and run where cudasnap is not installed.

DIR gets replay.c (program.c's runtime, then the recorded calls), adapter.c and adapter.h, replay.ptx (every
module's PTX, merged as the replay merges it; `make run` copies replay.MODE.ptx over it), data/ (H2D payloads, expected D2H results) and a
Makefile (`make SIM=DIR`, `make run CONFIG=... MODE=functional|performance`). The program
relocates what the snapshot proves to be pointers, exactly as `replay --sim`: pointer
parameters, words of uploads and of expected results inside allocations live at the copy; what
cannot be proved, or a call the simulator program cannot make, stops the export naming it."""
from __future__ import annotations

import os
from importlib import resources
from typing import Dict, List, Tuple

from cudasnap.formats.abi import base_name
from cudasnap.formats.vocab import alloc_range, family, in_class, is_launch, is_query, is_sync

from . import DEFAULT_CONFIG, SimProblem, kernel_names, plan, pointer_problems
from .ptx import for_mode, merge

# the classes sim_setup (calls that set up what the simulator program has already: a context,
# the merged PTX, its handles; or only touch host memory), sim_alloc and sim_free are the
# description's (shim/overlay.py)


def _arr(name: str, vals: List[int]) -> str:
    return f"static const unsigned {name}[] = {{{', '.join(map(str, vals)) or '0'}}};"


def _bytes(name: str, b: bytes) -> str:
    body = ", ".join(str(x) for x in b) or "0"
    return f"static const unsigned char {name}[] = {{{body}}};"


def export_sim(snapshot, outdir: str) -> Tuple[int, int, int]:
    """Write the program; returns (calls, launches, D2H checks). Raises SimProblem naming what
    cannot be exported."""
    from cudasnap.formats import SnapshotReader
    from cudasnap.replay.options import ReplayOptions
    reader = SnapshotReader(os.fspath(snapshot))
    p = plan(reader, ReplayOptions(), [])
    problems = p.refusals + pointer_problems(reader)
    if problems:
        raise SimProblem(problems[0])
    names = kernel_names(reader)
    data = os.path.join(outdir, "data")
    os.makedirs(data, exist_ok=True)
    live: Dict[int, int] = {}

    def inside(v: int) -> bool:
        return any(b <= v < b + n for b, n in live.items())

    def words(b: bytes) -> List[int]:
        return [o for o in range(0, len(b) - 7, 8) if inside(int.from_bytes(b[o:o + 8], "little"))]

    decl: List[str] = []
    body: List[str] = []
    kid: Dict[str, int] = {}
    calls = launches = checks = 0
    for rec in reader.records(("c",)):
        f = rec.get("f") or ""
        b = base_name(f)
        a = rec.get("a") or {}
        x = rec.get("x") or {}
        s = rec.get("s")
        if rec.get("r", 0) != 0 or rec.get("incomplete") or "r" not in rec or is_query(f) \
                or in_class(b, "sim_setup") and not is_sync(b) and not in_class(b, "names_global"):
            continue
        at = f'AT({s}, "{f}"); '
        r = alloc_range(rec)
        if in_class(b, "names_global") and isinstance(a.get("dptr"), int) and a["dptr"]:
            sim = p.global_calls.get(s)
            if sim is None:
                raise SimProblem(f"call #{s} {f}: module global {a.get('name')} is not in the simulated PTX")
            size = next(n for gl in p.globals.values() for v, n in gl.values() if v == sim)
            live[a["dptr"]] = size
            body.append(f"{at}global_at({a['dptr']:#x}ULL, {p.global_order.index(sim)}, {len(p.global_order)}, {size});")
        elif in_class(b, "sim_alloc") and r:
            live[r[0]] = r[1]
            body.append(f"{at}alloc({r[0]:#x}ULL, {r[1]});")
        elif r:
            raise SimProblem(f"call #{s} {f}: the simulator program allocates with cudaMalloc only (no VMM mappings)")
        elif in_class(b, "sim_free"):
            live.pop(a.get("dptr"), None)
            body.append(f"{at}release({a.get('dptr') or 0:#x}ULL);")
        elif is_sync(b):
            body.append(f"{at}CK(sim_sync());")
        elif in_class(b, "h2d_copy"):
            ref = x.get("srcHost")
            if not isinstance(ref, dict) or not reader.has_blob(ref.get("blob") or ""):
                raise SimProblem(f"call #{s} {f}: its payload was not captured")
            payload = reader.blob(ref["blob"])
            with open(os.path.join(data, f"h2d-{s}.bin"), "wb") as fh:
                fh.write(payload)
            decl.append(_arr(f"W{s}", words(payload)))
            body.append(f'{at}h2d({a.get("dstDevice"):#x}ULL, "h2d-{s}.bin", {len(payload)}, W{s}, '
                        f'{len(words(payload))});')
        elif in_class(b, "d2h_copy"):
            ref = x.get("dstHost")
            if not isinstance(ref, dict) or not reader.has_blob(ref.get("blob") or ""):
                body.append(f"{at}CK(sim_sync());")
                continue
            want = reader.blob(ref["blob"])
            with open(os.path.join(data, f"d2h-{s}.bin"), "wb") as fh:
                fh.write(want)
            decl.append(_arr(f"W{s}", words(want)))
            body.append(f'{at}d2h({a.get("srcDevice"):#x}ULL, "d2h-{s}.bin", {len(want)}, W{s}, {len(words(want))});')
            checks += 1
        elif in_class(b, "d2d_copy"):
            body.append(f"{at}CK(sim_d2d(tr({a.get('dstDevice'):#x}ULL), tr({a.get('srcDevice'):#x}ULL), "
                        f"{a.get('ByteCount')}));")
        elif in_class(b, "memset_1d"):
            width = {"8": 1, "16": 2, "32": 4}[b[len("cuMemsetD"):].replace("Async", "")]
            val = a.get({1: "uc", 2: "us", 4: "ui"}[width], 0)
            body.append(f"{at}memset_n({a.get('dstDevice'):#x}ULL, {val}u, {width}, {a.get('N', 0)});")
        elif in_class(b, "launches_kernel"):
            if in_class(b, "config_launch"):
                from cudasnap.replay.params import LAUNCH_CONFIG
                cfg = a.get("config")
                if not isinstance(cfg, (bytes, bytearray)) or len(cfg) < LAUNCH_CONFIG.size:
                    raise SimProblem(f"call #{s} {f}: its launch configuration was not captured")
                gx, gy, gz, bx, by, bz, shm, _hs, _ap, nattr = LAUNCH_CONFIG.unpack_from(bytes(cfg))
                if nattr:
                    raise SimProblem(f"call #{s} {f}: launch attributes (clusters, cooperative) are not simulated")
                a = dict(a, gridDimX=gx, gridDimY=gy, gridDimZ=gz, blockDimX=bx, blockDimY=by, blockDimZ=bz,
                         sharedMemBytes=shm)
            name = names.get(a.get("f")) or ""
            sim = p.replace.get(name) or next((m[name] for m in p.modules.values() if name in m), None)
            params = x.get("params")
            if sim is None or params is None:
                raise SimProblem(f"call #{s} {f}: kernel {name or '?'} has no PTX or its parameters were not captured")
            params = bytes(params)
            lay = p.layouts[sim]
            # 8-byte parameters and the aligned words of larger ones (structs by value) that
            # point into live allocations, as replay --sim relocates them
            ptrs = [w for o, sz in lay if sz >= 8 and o % 8 == 0 for w in range(o, min(o + sz, len(params)) - 7, 8)
                    if inside(int.from_bytes(params[w:w + 8], "little"))]
            k = kid.setdefault(sim, len(kid))
            decl += [_bytes(f"P{s}", params), _arr(f"Q{s}", ptrs)]
            body.append(f'{at}launch(&K[{k}], "{sim}", {a.get("gridDimX", 1)}, {a.get("gridDimY", 1)}, '
                        f'{a.get("gridDimZ", 1)}, {a.get("blockDimX", 1)}, {a.get("blockDimY", 1)}, '
                        f'{a.get("blockDimZ", 1)}, {a.get("sharedMemBytes", 0)}, P{s}, {len(params)}, O{k}, {len(lay)}, '
                        f'Q{s}, {len(ptrs)});')
            launches += 1
        elif is_launch(f) or family(b) in ("memory", "vmm", "pool", "graph", "stream", "launch"):
            raise SimProblem(f"call #{s} {f}: not exported for the simulator (allocations, copies, memsets, "
                             f"cuLaunchKernel and synchronization are)")
        else:
            continue
        calls += 1
    if not launches:
        raise SimProblem(f"{snapshot}: no kernel launch to export")
    offs = [_arr(f"O{k}", [o for o, _sz in p.layouts[sim]]) for sim, k in kid.items()]
    runtime = resources.files("cudasnap.replay.sim").joinpath("program.c").read_text()
    src = [f"/* Generated by `cudasnap export --sim` from {os.path.basename(os.fspath(snapshot))}: "
           f"{calls} calls, {launches} launches. */", runtime, f"static void *K[{max(len(kid), 1)}];", *offs, *decl,
           "int main(void) {", "    char dir[4096];",
           '    if (!getcwd(dir, sizeof dir) || sim_load_ptx(dir, "replay.ptx")) die("replay.ptx did not load");',
           *("    " + ln for ln in body), "    CK(sim_sync());", "    return finish();", "}"]
    with open(os.path.join(outdir, "replay.c"), "w") as fh:
        fh.write("#include <unistd.h>\n" + "\n".join(src) + "\n")
    for name in ("adapter.c", "adapter.h"):
        with open(os.path.join(outdir, name), "w") as fh:
            fh.write(resources.files("cudasnap.replay.sim").joinpath(name).read_text())
    merged = merge(p.texts)
    for name, mode in (("replay.ptx", "functional"), ("replay.functional.ptx", "functional"),
                       ("replay.performance.ptx", "performance")):
        with open(os.path.join(outdir, name), "w") as fh:
            fh.write(for_mode(merged, mode))
    with open(os.path.join(outdir, "Makefile"), "w") as fh:
        fh.write(MAKEFILE.replace("@CONFIG@", DEFAULT_CONFIG))
    return calls, launches, checks


MAKEFILE = """# Built by `cudasnap export --sim`: a replay on GPGPU-Sim. `make SIM=DIR` builds ./replay against the
# simulator's lib/libcudart.so; `make run SIM=DIR [CONFIG=...] [MODE=functional|performance]` copies
# the model's config here and runs it (exit 0 verified, 1 a result differs, 2 cannot proceed).
SIM ?= $(CUDASNAP_GPGPUSIM)
CONFIG ?= @CONFIG@
MODE ?= functional
CFLAGS ?= -O1

replay: replay.c adapter.c adapter.h
\t$(CC) $(CFLAGS) -o $@ replay.c adapter.c -L$(SIM)/lib -lcudart -Wl,-rpath,$(SIM)/lib

run: replay
\tcp $(SIM)/configs/$(CONFIG)/* .
\tcp replay.$(MODE).ptx replay.ptx
\techo "-gpgpu_ptx_sim_mode $(if $(filter performance,$(MODE)),0,1)" >> gpgpusim.config
\t# the simulator keeps a bool option in an int whose upper bytes come from the heap: zeroed allocations keep it 0
\tMALLOC_PERTURB_=255 LD_LIBRARY_PATH=$(SIM)/lib ./replay > sim.log

clean:
\trm -f replay sim.log

.PHONY: run clean
"""
