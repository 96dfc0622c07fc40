"""Replay on a simulator (`cudasnap replay SNAP --sim gpgpu-sim[:CONFIG]`): GPGPU-Sim runs the
snapshot's kernels on the CPU and each D2H result is verified against the recorded one (with
`--sim-max-ctas`, only the bytes its sampled CTAs wrote).

This side plans the run before anything is simulated: the PTX of every module (a fatbin's PTX
entry, or a PTX module; `--replace K=FILE.ptx` for a kernel without one), the constructs the
simulator mishandles, the pointers stored in uploaded buffers that can be relocated (or the
refusal naming the buffer). Then a worker process (worker.py) replays with the engine driving
the simulator through the adapter (adapter.c, driver.py), in a directory holding the model's
config; performance mode turns the simulator's per-kernel cycles into a timeline profile."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .ptx import PROBE

SIMULATORS = ("gpgpu-sim",)
DEFAULT_CONFIG = "SM86_RTX3070"
ENV_PATH = "CUDASNAP_GPGPUSIM"
MODES = ("functional", "performance")
HEAP_START = 0xC0000000        # the simulator's first heap address: placement succeeds above it
# The simulator's allocator can be padded up to recorded addresses (driver.cuMemAddressReserve),
# but this build's kernels read and write wrongly above 4 GiB (a fill of 16 KiB at 0x6000_0000_8000
# left 12 KiB unwritten), where every GPU address lies: so allocations move by default, and
# CUDASNAP_SIM_PLACEMENT=recorded keeps recorded addresses (for a simulator without that limit).
PLACEMENT_ENV = "CUDASNAP_SIM_PLACEMENT"


def exact_placement() -> bool:
    return os.environ.get(PLACEMENT_ENV, "") == "recorded"


def moves(base: int) -> bool:
    """Will placement relocate the allocation recorded at base? (Spans are reserved in address
    order from the simulator's bump allocator: only one below its heap, or every one when
    recorded addresses are not asked for.)"""
    return not exact_placement() or base < HEAP_START + (4 << 20)


class SimProblem(Exception):
    """A one-line reason the simulated replay cannot proceed (exit 2)."""


@dataclass
class Sim:
    path: str
    config: str
    mode: str
    why: str = "asked for"        # how the model was chosen

    @property
    def lib(self) -> str:
        return os.path.join(self.path, "lib")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.path, "configs", self.config)

    @property
    def device_name(self) -> str:
        return f"GPGPU-Sim {self.config} (simulated)"

    def core_mhz(self) -> Optional[float]:
        try:
            with open(os.path.join(self.config_dir, "gpgpusim.config")) as f:
                m = re.search(r"^\s*-gpgpu_clock_domains\s+([0-9.]+):", f.read(), re.M)
            return float(m.group(1)) if m else None
        except OSError:
            return None

    def cc(self) -> Tuple[int, int]:
        m = re.match(r"SM(\d)(\d?)_", self.config)
        return (int(m.group(1)), int(m.group(2) or 0)) if m else (7, 0)


def configs(path: str) -> List[str]:
    d = os.path.join(path, "configs")
    return sorted(c for c in os.listdir(d) if os.path.isfile(os.path.join(d, c, "gpgpusim.config"))) \
        if os.path.isdir(d) else []


def captured_gpu(reader) -> Optional[Dict[str, Any]]:
    """The GPU the program ran on ({"name", "cc"}): its first context's device, else the first."""
    gpus: List[Dict[str, Any]] = []
    dev = None
    for rec in reader.records(("proc", "ctx")):
        if rec.get("k") == "proc" and isinstance(rec.get("gpus"), list) and not gpus:
            gpus = [g for g in rec["gpus"] if isinstance(g, dict)]
        elif rec.get("k") == "ctx" and dev is None and isinstance(rec.get("device"), int):
            dev = rec["device"]
    return next((g for g in gpus if g.get("index") == dev), gpus[0] if gpus else None)


def pick_config(have: List[str], gpu: Optional[Dict[str, Any]]) -> Tuple[str, str]:
    """The model closest to the captured GPU, and why: a config named after the GPU (SM90_H100
    for an H100; an H200 is the same sm_90 chip with more memory), else the one of the same
    compute capability, else the newest one below it; the default where nothing is known."""
    fallback = DEFAULT_CONFIG if DEFAULT_CONFIG in have else (have[0] if have else DEFAULT_CONFIG)
    cc = gpu.get("cc") if gpu else None
    if not gpu or not isinstance(cc, list) or len(cc) != 2:
        return fallback, "the snapshot does not say which GPU it was captured on"
    name = str(gpu.get("name") or "?")
    want = cc[0] * 10 + cc[1]
    what = f"closest to the captured {name} (sm_{want})"

    def sm(c: str) -> int:
        m = re.match(r"SM(\d)(\d?)_", c)
        return int(m.group(1)) * 10 + int(m.group(2) or 0) if m else -1
    for c in have:
        chip = c.partition("_")[2]
        if chip and re.search(rf"\b{re.escape(chip)}\b", name.replace("H200", "H100")):
            return c, what
    same = [c for c in have if sm(c) == want]
    if same:
        return same[0], what
    below = sorted((c for c in have if 0 <= sm(c) < want), key=sm)
    if below:
        return below[-1], f"{what}: the newest model below it"
    return fallback, f"no model at or below the captured {name} (sm_{want})"


def resolve(spec: str, sim_path: Optional[str], mode: str, gpu: Optional[Dict[str, Any]] = None) -> Sim:
    """`gpgpu-sim[:CONFIG]`, the build's directory (--sim-path, else $CUDASNAP_GPGPUSIM) and the
    mode; without a CONFIG, the model closest to gpu (the captured one: Sim.why says so)."""
    name, _, config = spec.partition(":")
    if name not in SIMULATORS:
        raise SimProblem(f"--sim {spec}: unknown simulator (known: {', '.join(SIMULATORS)}[:CONFIG])")
    if mode not in MODES:
        raise SimProblem(f"--sim-mode {mode}: expected functional or performance")
    path = sim_path or os.environ.get(ENV_PATH)
    if not path:
        raise SimProblem(f"--sim {name}: where is the GPGPU-Sim build? give --sim-path DIR or set {ENV_PATH}=DIR "
                         f"(a directory holding lib/libcudart.so and configs/)")
    if not os.path.isfile(os.path.join(path, "lib", "libcudart.so")):
        raise SimProblem(f"{path}: not a GPGPU-Sim build (no lib/libcudart.so); point --sim-path or {ENV_PATH} at one")
    have = configs(path)
    why = "asked for"
    if not config:
        config, why = pick_config(have, gpu)
    if config not in have:
        raise SimProblem(f"--sim {spec}: no config {config} in {os.path.join(path, 'configs')} "
                         f"(it has: {', '.join(have) or 'none'})")
    return Sim(os.path.abspath(path), config, mode, why)


# ----------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    modules: Dict[str, Dict[str, str]] = field(default_factory=dict)   # PTX digest -> {kernel: name in merged PTX}
    layouts: Dict[str, List[Tuple[int, int]]] = field(default_factory=dict)
    replace: Dict[str, str] = field(default_factory=dict)              # kernel -> name in merged PTX
    texts: List[str] = field(default_factory=list)                     # the PTX modules merged, in order
    refusals: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    seqs: List[int] = field(default_factory=list)                      # launches the replay will simulate
    images: Dict[str, str] = field(default_factory=dict)               # image blob id -> PTX digest (kept PTX)
    have: Dict[str, Tuple[str, int]] = field(default_factory=dict)     # kernel -> (its PTX body, load call)
    source: Dict[str, str] = field(default_factory=dict)               # kernel -> where its PTX comes from
    no_ptx: Dict[str, Tuple[str, str]] = field(default_factory=dict)   # kernel -> (short reason, why) without PTX
    image: Dict[str, str] = field(default_factory=dict)                # kernel -> its module image's format
    globals: Dict[str, Dict[str, Tuple[str, int]]] = field(default_factory=dict)  # PTX digest -> {variable: (name in merged PTX, bytes)}
    global_gaps: List[str] = field(default_factory=list)               # module globals the simulator cannot provide
    global_calls: Dict[int, str] = field(default_factory=dict)         # lookup call -> name in merged PTX
    global_order: List[str] = field(default_factory=list)              # the probe's order (ptx.probe)


def kernel_names(reader) -> Dict[Any, str]:
    """Recorded function (or kernel) handle -> kernel name, from fn records and lookups."""
    from cudasnap.formats.vocab import in_class
    names: Dict[Any, str] = {}
    for rec in reader.records(("c", "fn")):
        if rec.get("k") == "fn":
            if isinstance(rec.get("name"), str):
                names.setdefault(rec.get("h"), rec["name"])
            continue
        a = rec.get("a") or {}
        f = rec.get("f") or ""
        if rec.get("r") == 0 and in_class(f, "asks_by_name") and isinstance(a.get("name"), str):
            names[a.get("hfunc") or a.get("pKernel")] = a["name"]
    return names


def _selected(reader, opts, names) -> Tuple[Dict[str, int], int]:
    """{kernel: first call} of the launches the replay will run, and their count (-s/-c are
    counted by the replay; here every launch the other filters pass is checked)."""
    from cudasnap.formats.vocab import is_launch
    from cudasnap.replay.selection import LaunchSelection
    sel = LaunchSelection(opts.kernels, opts.calls, opts.kernel_name, opts.kernel_name_base or "function",
                          func_names=names)
    out: Dict[str, int] = {}
    n = 0
    seqs: List[int] = []
    for rec in reader.records(("c",)):
        f = rec.get("f") or ""
        if not is_launch(f) or rec.get("r", 0) != 0 or "r" not in rec:
            continue
        name = names.get((rec.get("a") or {}).get("f")) or ""
        if sel._match(rec, name):
            out.setdefault(name, rec.get("s"))
            seqs.append(rec.get("s"))
            n += 1
    seqs = seqs[opts.launch_skip or 0:]
    if opts.launch_count is not None:
        seqs = seqs[:opts.launch_count]
    return out, seqs


def plan(reader, opts, replace_specs: List[Tuple[str, str]]) -> Plan:
    from cudasnap.formats.jitptx import kept_ptx
    from cudasnap.replay.retarget import module_loads, ptx_of
    from . import ptx as P
    p = Plan()
    names = kernel_names(reader)
    wanted, p.seqs = _selected(reader, opts, names)
    taken: Dict[str, str] = {}          # name in merged PTX -> digest of its module
    have, sass = p.have, p.no_ptx
    unused = set()                      # digests of modules none of whose kernels is launched here
    images = _images(reader)
    kept = kept_ptx(reader)
    loads = module_loads(reader)
    asked = _globals_asked(reader, loads)            # load seq -> [(call, variable)]
    digest_of: Dict[int, str] = {}                   # load seq -> digest of its PTX
    gtaken: set = set()                              # variable names in the merged PTX
    bare: Dict[str, set] = {}                        # digest -> its variables without storage
    for ld in loads:
        if ld.get("r") not in (0, None):
            continue
        blob, bid = images.get(ld["seq"], (None, None))
        for k in ld["kernels"] | ld.get("launched", set()):
            p.image.setdefault(k, ld["info"].format)
        got = None
        if blob is not None:
            try:
                got = ptx_of(blob)
            except ValueError as e:
                p.warnings.append(f"call #{ld['seq']} {ld['call']}: {e}")
        src = "image"
        if got is None and bid in kept:          # a JIT compiler's cubin: the PTX kept beside it
            got, src = (0, kept[bid]["ptx"]), str(kept[bid].get("from") or "kept")
        if got is None:
            what = ld["info"].describe() if ld["info"].format != "unknown" else "no PTX in the image"
            short = "no PTX (SASS only)" if ld["info"].sass else "no PTX in the image"
            for k in ld["kernels"] | ld.get("launched", set()):
                sass.setdefault(k, (short, f"module of call #{ld['seq']}: {what}"))
            continue
        text = P.text(got[1])
        digest = hashlib.sha256(text.encode()).hexdigest()     # as the replay's module load sees it
        text = P.for_sim(text)
        if bid in kept:
            p.images[bid] = digest
        digest_of[ld["seq"]] = digest
        if digest in p.modules or digest in unused and not asked.get(ld["seq"]):
            continue
        unused.discard(digest)
        ents = P.entries(text)
        if not set(ents) & set(wanted) and not asked.get(ld["seq"]):
            # none of its kernels runs in this replay: it stays out of the merged file (the parser
            # stops on PTX it rejects anywhere in it, ldmatrix in a kernel not selected)
            unused.add(digest)
            bodies = P.bodies(text)
            for k in ents:
                have.setdefault(k, (bodies.get(k, ""), ld["seq"]))
                p.source.setdefault(k, src)
            continue
        mapping: Dict[str, str] = {}
        for k in ents:
            sim = k
            if sim in taken:
                sim = f"{k}__cs{len(p.texts)}"
                text = P.rename_entry(text, k, sim)
            taken[sim] = digest
            mapping[k] = sim
        # a kernel not run here whose PTX the simulator refuses stays out (the parser stops on it
        # anywhere in the file); its handle is still given, never launched
        bodies = P.bodies(text)
        idle = {k: sim for k, sim in mapping.items() if k not in wanted
                and any(refuse for _w, refuse in P.constructs(bodies.get(sim, "")))}
        for k, sim in idle.items():
            have.setdefault(k, (bodies.get(sim, ""), ld["seq"]))
            p.source.setdefault(k, src)
        text = P.drop_entries(text, list(idle.values()))
        gl: Dict[str, Tuple[str, int]] = {}
        for v, (_space, size) in P.variables(text).items():
            if size is None:
                bare.setdefault(digest, set()).add(v)
                continue
            sim = v if v not in gtaken else f"{v}__csg{len(p.texts)}"
            if sim != v:                 # the same variable name in two modules: one each
                text = P.rename_entry(text, v, sim)
            gtaken.add(sim)
            gl[v] = (sim, size)
        p.globals[digest] = gl
        ents = P.entries(text)
        bodies = P.bodies(text)
        for k, sim in mapping.items():
            if k in idle:
                continue
            p.layouts[sim] = ents[sim]
            have.setdefault(k, (bodies.get(sim, ""), ld["seq"]))
            p.source.setdefault(k, src)
        p.modules[digest] = mapping
        p.texts.append(text)
    for kernel, path in replace_specs:
        if not path.endswith(".ptx"):
            p.refusals.append(f"--replace {kernel}={path}: the simulator runs PTX; give a .ptx file")
            continue
        try:
            with open(path, "rb") as f:
                text = P.for_sim(P.text(f.read()))
        except OSError as e:
            p.refusals.append(f"--replace {kernel}={path}: {e.strerror}")
            continue
        ents = P.entries(text)
        if kernel in ents:             # the file's other entries the simulator refuses stay out, as above
            bodies = P.bodies(text)
            text = P.drop_entries(text, [e for e in ents if e != kernel and any(
                refuse for _w, refuse in P.constructs(bodies[e]))])
            ents = P.entries(text)
        if kernel not in ents:
            p.refusals.append(f"--replace {kernel}={path}: the PTX has no entry {kernel} "
                              f"(it has: {', '.join(ents) or 'none'})")
            continue
        sim = f"{kernel}__csrep{len(p.texts)}"
        text = P.rename_entry(text, kernel, sim)
        for other in ents:
            if other != kernel and other in taken:
                text = P.rename_entry(text, other, f"{other}__csrep{len(p.texts)}")
        ents, bodies = P.entries(text), P.bodies(text)
        orig = have.get(kernel)
        if orig is not None:
            old = [s for _o, s in P.entries(orig[0]).get(kernel, [])]
            new = [s for _o, s in ents[sim]]
            if old and old != new:
                p.refusals.append(f"--replace {kernel}={path}: parameter sizes {new} differ from the recorded kernel's {old}")
                continue
        p.layouts[sim] = ents[sim]
        p.replace[kernel] = sim
        have[kernel] = (bodies.get(sim, ""), have.get(kernel, ("", 0))[1])
        p.source[kernel] = f"--replace {path}"
        p.texts.append(text)
    for seq, calls in sorted(asked.items()):
        gl = p.globals.get(digest_of.get(seq, ""))
        for rec, v in calls:
            if gl is not None and v in gl:
                p.global_calls[rec.get("s")] = gl[v][0]
                continue
            why = (f"its module (call #{seq}) has no PTX" if gl is None else
                   f"the module's PTX (call #{seq}) gives it no storage of its own (.extern, or an array of "
                   f"unstated size)" if v in bare.get(digest_of[seq], ()) else
                   f"the module's PTX (call #{seq}) does not define it")
            p.global_gaps.append(f"call #{rec.get('s')} {rec.get('f')} asks for module global {v}: {why}; "
                                 f"the simulator cannot provide it")
    p.global_order = [sim for gl in p.globals.values() for sim, _n in gl.values()]
    if p.global_order:
        p.texts.append(P.probe(p.global_order))
    p.refusals += p.global_gaps
    for kernel, first in sorted(wanted.items(), key=lambda kv: kv[1] or 0):
        refusals, warnings = kernel_problems(p, kernel, first)
        p.refusals += [line for _short, line in refusals]
        p.warnings += [line for _short, line in warnings]
    return p


def kernel_problems(p: Plan, kernel: str, first) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """What keeps one kernel off the simulator, and its warnings: each as (short reason, line)."""
    from . import ptx as P
    if kernel not in p.have:
        short, why = p.no_ptx.get(kernel, ("no PTX (image not captured)", "its module's image was not captured"))
        return [(short, f"kernel {kernel} (first launched at call #{first}) has no PTX ({why}); the simulator "
                        f"runs PTX only: supply one with --replace {kernel}=FILE.ptx")], []
    out, warn = [], []
    for what, refuse in P.constructs(p.have[kernel][0]):
        if refuse:
            out.append((what.split(" (")[0], f"kernel {kernel} uses {what}; the simulator cannot run it"))
        elif refuse is None:
            warn.append((what.split(",")[0], f"kernel {kernel} uses {what}"))
        else:
            warn.append((what.split(" (")[0],
                         f"kernel {kernel} uses {what}; a mismatch below may be the simulator's, not the kernel's"))
    return out, warn


def _globals_asked(reader, loads) -> Dict[int, List[Tuple[Dict[str, Any], str]]]:
    """Load seq -> [(call, variable name)] of the module-global lookups that succeeded, each
    matched to the latest load of its module handle before it."""
    from cudasnap.formats.vocab import in_class
    by: Dict[Any, List[int]] = {}
    for ld in loads:
        if ld.get("handle") and ld.get("r") in (0, None):
            by.setdefault(ld["handle"], []).append(ld["seq"])
    out: Dict[int, List[Tuple[Dict[str, Any], str]]] = {}
    for rec in reader.records(("c",)):
        f = rec.get("f") or ""
        a = rec.get("a") or {}
        if rec.get("r") != 0 or not in_class(f, "names_global") or not isinstance(a.get("name"), str):
            continue
        seqs = [s for s in by.get(a.get("hmod") or a.get("library"), []) if s < (rec.get("s") or 0)]
        if seqs:
            out.setdefault(seqs[-1], []).append((rec, a["name"]))
    return out


def _images(reader) -> Dict[int, Tuple[bytes, str]]:
    out = {}
    for rec in reader.records(("c",)):
        ref = (rec.get("x") or {}).get("image")
        if isinstance(ref, dict) and isinstance(ref.get("blob"), str) and reader.has_blob(ref["blob"]):
            out[rec.get("s")] = (reader.blob(ref["blob"]), ref["blob"])
    return out


# ------------------------------------------------------------------------ pointers in buffers
def pointer_problems(reader, moved=moves) -> List[str]:
    return [line for line, _buf in pointer_findings(reader, moved)]


def pointer_findings(reader, moved=moves) -> List[Tuple[str, Optional[Tuple[int, int]]]]:
    """(line, (base, size) of the buffer written or None) of each pointer problem below.

    Uploaded buffers holding values the simulator's addresses would make wrong and that cannot
    be proved to be pointers. An aligned 8-byte word of an H2D payload inside an allocation live
    at the copy is a pointer the replay relocates; a word equal to the end of a live allocation
    (a one-past-the-end pointer: it may belong to the next one), one inside an allocation not
    live then (freed, or not yet made), or is not
    provable: the replay refuses, naming the buffer and the call. Only words that reach an
    allocation placement moves (moved(base)) matter: the others keep their recorded value."""
    import numpy as np
    from cudasnap.formats.vocab import alloc_range, in_class, is_release
    recs = list(reader.records(("c",)))
    every: List[Tuple[int, int, Any]] = []
    for rec in recs:
        r = alloc_range(rec)
        if r and r[0] and moved(r[0]):
            every.append((r[0], r[1], rec.get("s")))
    if not every:
        return []
    lo = min(b for b, _n, _s in every)
    hi = max(b + n for b, n, _s in every)
    live: Dict[int, Tuple[int, Any]] = {}
    out: List[Tuple[str, Optional[Tuple[int, int]]]] = []

    def where(v: int, table) -> Optional[Tuple[int, int, Any]]:
        for b, (n, s) in table.items():
            if b <= v < b + n:
                return b, n, s
        return None

    for rec in recs:
        f = rec.get("f") or ""
        a = rec.get("a") or {}
        r = alloc_range(rec)
        if r and r[0]:
            live[r[0]] = (r[1], rec.get("s"))
            continue
        if is_release(f) and rec.get("r", 0) == 0:
            for key in ("dptr", "ptr", "dp"):
                if isinstance(a.get(key), int):
                    live.pop(a[key], None)
            continue
        if not in_class(f, "h2d_copy"):
            continue
        ref = (rec.get("x") or {}).get("srcHost")
        if not isinstance(ref, dict) or not reader.has_blob(ref.get("blob") or ""):
            continue
        data = reader.blob(ref["blob"])
        dst = a.get("dstDevice") or 0
        n = len(data) // 8
        if n <= 0:
            continue
        w = np.frombuffer(data, dtype="<u8", count=n)
        for i in np.nonzero((w >= lo) & (w <= hi))[0][:4096]:
            v, off = int(w[i]), 8 * int(i)
            if where(v, live) is not None:
                continue                   # inside a live allocation: relocated by the replay
            end = next(((b, sz, s) for b, (sz, s) in live.items() if b + sz == v and moved(b)), None)
            if end is not None:
                why = (f"the word at offset {off} ({v:#x}) is the end of allocation {end[0]:#x} (call #{end[2]}), "
                       f"not inside it")
            else:
                hit = next(((b, sz, s) for b, sz, s in every if b <= v < b + sz), None)
                if hit is None:
                    continue
                why = (f"the word at offset {off} ({v:#x}) points into allocation {hit[0]:#x} (call #{hit[2]}), "
                       f"which is not allocated at this copy")
            buf = where(dst, live)
            name = f"buffer {buf[0]:#x} ({buf[1]} B, call #{buf[2]})" if buf else f"device address {dst:#x}"
            out.append((f"call #{rec.get('s')} {f} writes {name}: {why}; the simulator places memory at its own "
                        f"addresses and this value cannot be relocated with proof", (buf[0], buf[1]) if buf else None))
            break
    return out


# --------------------------------------------------------------------------- calls it cannot take
def _via(dispatch, driver, f: str):
    """The simulator's method for a function whose handler replays it through another entry
    point (cuModuleLoad of a file: the recorded image goes to cuModuleLoadData)."""
    h = dispatch.lookup(f)
    return getattr(driver, h.via, None) if h is not None and h.via else None


def call_gaps(reader) -> List[str]:
    """The recorded calls the replay would hand the simulator's driver (driver.py) that it does
    not implement, one line per function: its name, how many calls, the first. Found before
    anything runs, so one refusal lists them all."""
    return [gap_line(f, recs) for f, recs in gap_calls(reader).items()]


def gap_line(f: str, recs: List[Dict[str, Any]]) -> str:
    s = [r.get("s") for r in recs]
    return f"{f} ({len(s)} call{'s' if len(s) > 1 else ''}, first #{s[0]}): the simulator adapter does not implement it"


def gap_calls(reader) -> Dict[str, List[Dict[str, Any]]]:
    """Function -> its recorded calls the simulator's driver does not implement, in call order."""
    from cudasnap.formats.abi import base_name
    from cudasnap.formats.vocab import in_class
    from cudasnap.replay import dispatch
    from .driver import SimDriver
    seen: Dict[str, List[Dict[str, Any]]] = {}
    verdict: Dict[str, bool] = {}
    for rec in reader.records(("c",)):
        f = rec.get("f") or ""
        if rec.get("r", 0) != 0 or not f:
            continue
        ok = verdict.get(f)
        if ok is None:
            b = base_name(f)
            m = getattr(SimDriver, f, None) or getattr(SimDriver, b, None) or _via(dispatch, SimDriver, f)
            ok = verdict[f] = (dispatch.replayed_by(f) not in ("class", "handler") or in_class(b, "sim_noop")
                               or m is not None and not (getattr(m, "only_recorded", False) and not exact_placement()))
        if not ok:
            seen.setdefault(f, []).append(rec)
    return dict(sorted(seen.items(), key=lambda kv: kv[1][0].get("s") or 0))


# ------------------------------------------------------------------------------------- the run
ADAPTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adapter.c")


def prepare_dir(sim: Sim, work: str, texts: List[str]) -> str:
    """The model's config files (in the requested mode), the merged PTX, the built adapter."""
    from .ptx import for_mode, merge
    for name in os.listdir(sim.config_dir):
        shutil.copy(os.path.join(sim.config_dir, name), work)
    with open(os.path.join(work, "gpgpusim.config"), "a") as f:
        f.write(f"\n-gpgpu_ptx_sim_mode {1 if sim.mode == 'functional' else 0}\n")
    with open(os.path.join(work, "replay.ptx"), "w") as f:
        f.write(for_mode(merge(texts), sim.mode))
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise SimProblem(f"no C compiler ({cc}) to build the simulator adapter; install one or set CC")
    so = os.path.join(work, "libcudasnap_sim.so")
    cp = subprocess.run([cc, "-O1", "-shared", "-fPIC", ADAPTER, "-o", so, f"-L{sim.lib}", "-lcudart",
                         f"-Wl,-rpath,{sim.lib}"], capture_output=True, text=True)
    if cp.returncode:
        raise SimProblem(f"building the simulator adapter failed: {(cp.stderr or cp.stdout).strip().splitlines()[-1:]}")
    return so


def kernel_cycles(log_path: str) -> List[Tuple[str, int]]:
    """(kernel, gpu_sim_cycle) per simulated kernel, in the order they finished."""
    out, name = [], None
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                if line.startswith("kernel_name = "):
                    name = line.split("=", 1)[1].strip()
                    if name == PROBE:        # the adapter's own lookup of module globals
                        name = None
                elif line.startswith("gpu_sim_cycle = ") and name is not None:
                    out.append((name, int(line.split("=", 1)[1])))
                    name = None
    except OSError:
        pass
    return out


def log_tail(log_path: str, n: int = 3) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return ""
    bad = [l for l in lines if re.search(r"ERROR|error|Assertion|abort|not implemented", l)]
    return " | ".join((bad or lines)[-n:])


def ptx_parse_error(log_path: str, ptx_path: str) -> Optional[str]:
    """A parse error of the simulator's PTX front end, named by function and line (the simulator
    then crashes); None when the log holds none."""
    try:
        with open(log_path, errors="replace") as f:
            m = re.search(r"(\S+\.ptx):(\d+):? (?:Syntax|Parse) error", f.read())
        if not m:
            return None
        with open(ptx_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    n = int(m.group(2))
    text = lines[n - 1].strip() if 0 < n <= len(lines) else "?"
    where = "?"
    for l in reversed(lines[:n]):
        e = re.search(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", l)
        if e:
            where = re.sub(r"__csrep\d+$", "", e.group(1))    # the name it had before the merge
            break
    return (f"the simulator cannot run it: its PTX parser rejects line {n} of {where} ({text[:80]!r}); "
            f"supply a PTX build it accepts with --replace KERNEL=FILE.ptx")


def run_sim_cli(snapshot, opts, sim_spec: str, sim_path: Optional[str], mode: str, as_json: bool = False,
                out_file: Optional[str] = None, keep: Optional[bool] = None, max_ctas: Optional[int] = None) -> int:
    """`cudasnap replay SNAP --sim ...`: plan, refuse what cannot run, replay on the simulator,
    write the profile of performance mode (max_ctas: bounded, see bounded.py). Returns replay's
    exit code."""
    from cudasnap.formats import SnapshotError
    from cudasnap.formats.opened import opened
    from cudasnap.replay import option_problem, snapshot_problem
    from cudasnap.replay.index import read_once
    from cudasnap.replay.replace import effective_specs, parse_specs

    def fail(msg: str) -> int:
        sys.stderr.write(f"cudasnap: error: {msg}\n")
        return 2
    try:
        sim = resolve(sim_spec, sim_path, mode)
        specs = parse_specs(effective_specs(opts))
    except (SimProblem, ValueError) as e:
        return fail(str(e))
    problem = option_problem(opts) or snapshot_problem(snapshot)
    if problem:
        return fail(problem)
    if out_file and mode != "performance":
        return fail("--out with --sim: simulated time needs --sim-mode performance")
    if max_ctas is not None and max_ctas < 2:
        return fail(f"--sim-max-ctas {max_ctas}: give 2 or more")
    bad = [t for t, _p in specs if t.startswith("module:") or t.startswith("0x")]
    if bad:
        return fail(f"--replace {bad[0]}: with --sim, replace kernels by name (KERNEL=FILE.ptx)")
    try:
        reader = read_once(opened(snapshot))     # checked by snapshot_problem; its records read once here
        p = plan(reader, opts, specs)
        ptrs = pointer_problems(reader)
        calls = call_gaps(reader)
        sid = _snapshot_id(reader)
        if not sim_spec.partition(":")[2]:
            sim = resolve(sim_spec, sim_path, mode, captured_gpu(reader))
    except SnapshotError as e:
        return fail(str(e))
    for w in p.warnings:
        sys.stderr.write(f"cudasnap: warning: {w}\n")
    gaps = p.refusals + ptrs + calls
    if len(gaps) == 1:
        return fail(gaps[0])
    if gaps:
        sys.stderr.write(f"cudasnap: error: the simulator cannot run this snapshot: {len(gaps)} gaps "
                         f"(nothing was simulated):\n" + "".join(f"  - {g}\n" for g in gaps))
        return 2
    if not opts.quiet and not as_json:
        print(f"simulator: GPGPU-Sim {sim.config} ({sim.why}), {mode} mode"
              + (f", launches over {max_ctas} CTAs {'timed on samples and ' if mode == 'performance' else ''}"
                 f"judged on their first {max_ctas} CTAs" if max_ctas else ""))
    import dataclasses
    options = dataclasses.asdict(opts)
    options.update(replace=[], relocate_payloads=True, jit=None)
    keep = bool(os.environ.get("CUDASNAP_SIM_KEEP")) if keep is None else keep   # the log, config and PTX, to debug
    try:
        if not max_ctas or mode == "functional":
            # functional with a cap: a bounded verdict (bounded.py), judged on each big launch's first CTAs
            code, result, cycles = _run(sim, p, snapshot, options, as_json, keep, max_ctas=max_ctas)
        else:
            # bounded: the verdict from a bounded functional pass (the same cap); the cycles from a
            # performance pass in which each launch over the cap runs samples of its first CTAs
            # (the results of that pass are partial: not reported)
            code, _r, _l = _run(dataclasses.replace(sim, mode="functional"), p, snapshot, options, as_json, keep,
                                max_ctas=max_ctas)
            if code not in (0, 1):
                return code
            timing = dict(options, continue_on_error=True, quiet=True)
            _c, result, cycles = _run(sim, p, snapshot, timing, False, keep, max_ctas=max_ctas, report=False)
    except SimProblem as e:
        return fail(str(e))
    if mode == "performance":
        rows = _profile_rows(result["launches"], cycles, sim.core_mhz(), p, result.get("sampled") or [])
        if out_file:
            _write_profile(out_file, rows, sim, snapshot, sid, result, code)
        if not opts.quiet and not as_json:
            _print_cycles(rows, sim)
    return code


def _run(sim: Sim, p: Plan, snapshot, options: Dict[str, Any], as_json: bool, keep: bool,
         max_ctas: Optional[int] = None, report: bool = True) -> Tuple[int, Dict[str, Any], List[Tuple[str, int]]]:
    """One replay on the simulator in a worker process: (exit code, the worker's result, the
    cycles of each kernel the simulator ran). SimProblem when it stopped before the end."""
    work = tempfile.mkdtemp(prefix="cudasnap-sim-")
    try:
        adapter = prepare_dir(sim, work, p.texts)
        job = {"snapshot": os.path.abspath(os.fspath(snapshot)), "options": options, "json": as_json,
               "adapter": adapter, "dir": work, "ptx": "replay.ptx", "modules": p.modules, "images": p.images,
               "globals": p.globals,
               "layouts": p.layouts, "replace": p.replace, "device_name": sim.device_name, "cc": list(sim.cc()),
               "total": len(p.seqs), "mode": sim.mode, "quiet": options.get("quiet"), "progress": options.get("progress"),
               "log": os.path.join(work, "sim.log"), "exact": exact_placement(), "result": os.path.join(work, "result.json"),
               "max_ctas": max_ctas, "sample_verdict": bool(max_ctas) and sim.mode == "functional",
               "whole": _whole(p) if max_ctas else {}}
        with open(os.path.join(work, "job.json"), "w") as f:
            json.dump(job, f)
        env = dict(os.environ)
        # the simulator keeps -gpgpu_ptx_use_cuobjdump (a bool option) in an int: its upper bytes are
        # whatever the heap held, and non-zero garbage sends kernel registration down the cuobjdump
        # path (a crash). Allocations filled with zeros (glibc: the complement of 255) keep it 0.
        env["MALLOC_PERTURB_"] = "255"
        env["LD_LIBRARY_PATH"] = sim.lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        sys.stdout.flush()
        cmd = [sys.executable, "-m", "cudasnap.replay.sim.worker", os.path.join(work, "job.json")]
        if report:
            # a process of its own: the simulator's runtime (LD_LIBRARY_PATH, MALLOC_PERTURB_) is set before a process starts
            cp = subprocess.run(cmd, cwd=work, env=env)
        else:      # a pass whose results are partial: its progress shown, its verdict and mismatches not
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True, errors="replace")
            for line in proc.stderr:
                if line.startswith("cudasnap: simulated "):
                    sys.stderr.write(line)
            cp = subprocess.CompletedProcess(cmd, proc.wait())
        try:
            with open(job["result"]) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = None
        if cp.returncode not in (0, 1, 2) or result is None:
            how = f"signal {-cp.returncode}" if cp.returncode < 0 else f"exit {cp.returncode}"
            parse = ptx_parse_error(job["log"], os.path.join(work, "replay.ptx"))
            raise SimProblem(parse or f"the simulator stopped ({how}) before the replay ended: {log_tail(job['log'])}")
        from cudasnap.formats.console import closed_at_start, note_write_failure
        if report and result.get("report_failed"):     # the report went to our stdout from the worker
            note_write_failure(1, result["report_failed"])
        elif report and closed_at_start(1) and (as_json or not options.get("quiet")):
            note_write_failure(1, "it was closed when cudasnap started")
        back = {sim: k for m in p.modules.values() for k, sim in m.items()}
        for name, (why, n) in sorted((result.get("whole_runs") or {}).items()):
            sys.stderr.write(f"cudasnap: note: {back.get(name, name)} ({n:,} CTAs) ran whole, not on a sample: {why}\n")
        for name, n in sorted(result["unsupported"].items()):
            sys.stderr.write(f"cudasnap: note: {name} ({n}x): the simulator adapter does not implement it\n")
        return cp.returncode, result, kernel_cycles(job["log"])
    finally:
        if keep:
            sys.stderr.write(f"cudasnap: simulator directory kept: {work}\n")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _whole(p: Plan) -> Dict[str, str]:
    """Kernels (names in the merged PTX) a bounded verdict runs whole, and why (bounded.unsampled)."""
    from .bounded import unsampled
    from .ptx import bodies
    out: Dict[str, str] = {}
    for text in p.texts:
        entries = bodies(text)
        funcs = text                       # the module without its entries: its .func definitions
        for body in entries.values():
            funcs = funcs.replace(body, "")
        for name, body in entries.items():
            # a kernel that calls device functions: any of its module's may be the one called
            why = unsampled(body) or (unsampled(funcs) if re.search(r"\bcall(?:\.uni)?\s", body) else None)
            if why:
                out[name] = why
    return out


def _snapshot_id(reader) -> Optional[str]:
    try:
        from cudasnap.replay.profile.report import snapshot_id
        return snapshot_id(reader.raw_header)
    except Exception:
        return None


def _profile_rows(launched: List[str], cycles: List[Tuple[str, int]], mhz: Optional[float], p: Plan,
                  sampled: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    from .bounded import fold
    back = {sim: k for m in p.modules.values() for k, sim in m.items()}
    back.update({sim: k for k, sim in p.replace.items()})
    rows = []
    t = 0.0
    runs = fold(cycles, sampled or [])
    for i, (name, cyc, est) in enumerate(runs):
        us = cyc / mhz if mhz else None
        r = {"index": i, "name": back.get(name, name), "cycles": cyc}
        if est is not None:
            r["bounded"] = est
        if len(runs) == len(p.seqs):
            r["seq"] = p.seqs[i]
        if us is not None:
            r.update(start_ns=int(t * 1e3), end_ns=int((t + us) * 1e3), time_us=us)
            t += us
        rows.append(r)
    return rows


def _print_cycles(rows, sim: Sim) -> None:
    if not rows:
        return
    mhz = sim.core_mhz()
    print(f"simulated ({sim.config}, core clock {mhz:g} MHz):" if mhz else f"simulated ({sim.config}):")
    for r in rows:
        t = f"  {r['time_us']:.2f} us" if "time_us" in r else ""
        b = r.get("bounded")
        e = (f" +- {b['error_cycles']} (+-{b['error_pct']:.0f}%), extrapolated from {b['sampled_ctas'][0]} and "
             f"{b['sampled_ctas'][1]} of {b['ctas']} CTAs ({b['sampled_cycles'][0]} and {b['sampled_cycles'][1]} cycles)"
             if b else "")
        print(f"  {r['name']}: {r['cycles']} cycles{t}{e}")


def _write_profile(path: str, rows, sim: Sim, snapshot, sid, result, code: int) -> None:
    """The timeline profile's shape (replay/profile/report.py), its GPU being the model."""
    import platform
    import time
    from cudasnap.formats.console import invoked_command
    from cudasnap.replay.profile.report import aggregate, write_out
    from cudasnap.replay.names import demangle
    for r in rows:
        r["demangled"] = demangle(r["name"])
    kernels = aggregate(rows)
    for k in kernels:
        k["demangled"] = demangle(k["name"])
        k["cycles"] = sum(r["cycles"] for r in rows if r["name"] == k["name"])
    total = sum(r.get("time_us", 0.0) for r in rows)
    summary = {"mode": "timeline", "backend": "gpgpu-sim", "simulated": True, "launches_timed": len(rows),
               "launches_selected": len(result["launches"]), "span_us": total, "kernel_time_us": total,
               "total_us": total, "cycles": sum(r["cycles"] for r in rows)}
    run = {"snapshot": os.path.abspath(os.fspath(snapshot)), "snapshot_id": sid,
           "gpu": {"index": 0, "name": sim.device_name, "simulated": True},
           "simulated": {"simulator": "gpgpu-sim", "config": sim.config, "config_why": sim.why, "mode": sim.mode,
                         "core_clock_mhz": sim.core_mhz(), "path": sim.path, "wall_s": result.get("wall_s")},
           "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "exit_code": code}
    try:
        run["command"] = invoked_command()
    except Exception:
        pass
    write_out({"summary": summary, "kernels": kernels, "launches": rows, "snapshot": os.fspath(snapshot),
               "warnings": [], "run": run}, path)
    print(f"profile written to {path}")
