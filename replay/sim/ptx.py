"""PTX text as the simulator takes it: entries and their parameter layouts, constructs the
simulator is known to mishandle, and one merged file for the whole replay (the simulator loads
one PTX file per process)."""
from __future__ import annotations

import re
import zlib
from typing import Dict, List, Optional, Tuple

from cudasnap.replay.numerics import APPROX

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*\(([^)]*)\)", re.S)
# Triton's (LLVM's) pointer parameters: `.param .u64 .ptr .global .align 1 NAME`
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)(?:\s+\.ptr(?:\s+\.(?:global|shared|const|local))?"
                    r"(?:\s+\.align\s+\d+)?)?\s+[\w$%]+(?:\[(\d+)\])?")
_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "b32": 4, "u32": 4, "s32": 4,
          "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}
_HEADER = re.compile(r"^\s*\.(version|target|address_size)\b.*$", re.M)

SHFL_NOTE = "// cudasnap: warp shuffle as a shared-memory exchange"
LDM_NOTE = "// cudasnap: 8x8 matrix load as shared-memory loads"
# (regex, what, refuse): refuse = the simulator aborts on it or cannot run it at all; None: a note
CONSTRUCTS: List[Tuple[re.Pattern, str, Optional[bool]]] = [
    (re.compile(r"\bcp\.async\.bulk\b|\bcp\.reduce\.async\.bulk\b"), "cp.async.bulk (TMA, Hopper)", True),
    (re.compile(r"\bcp\.async\b"), "cp.async (the simulator cannot parse it)", True),
    (re.compile(r"\bdp4a\b|\bdp2a\b"), "dp4a/dp2a (the simulator aborts: not implemented)", True),
    (re.compile(r"\bldmatrix\b|\bstmatrix\b"), "ldmatrix/stmatrix (the simulator cannot parse it; only the "
     "non-transposed ldmatrix with a 32-bit address is rewritten)", True),
    (re.compile(r"\bwgmma\b"), "wgmma (Hopper)", True),
    (re.compile(r"\bmbarrier\b"), "mbarrier (Hopper-style barriers)", True),
    (re.compile(r"\bsetmaxnreg\b"), "setmaxnreg (Hopper)", True),
    (re.compile(r"%cluster_|\.cluster\b|\bbarrier\.cluster\b|\.reqnctapercluster|\.explicitcluster"),
     "thread-block clusters (Hopper)", True),
    (re.compile(r"\bshfl\.sync\b"), "shfl.sync (the simulator gives wrong results for some uses)", False),
    (re.compile(re.escape(SHFL_NOTE)), "warp shuffles, run as shared-memory exchanges (performance mode "
     "counts that exchange's instructions and shared-memory traffic)", None),
    (re.compile(re.escape(LDM_NOTE)), "ldmatrix, run as shared-memory loads (performance mode counts those)", None),
    (re.compile(r"\bcvt\.\w+\.f16x2\b|\bcvt\.\w+\.bf16x2\b"), "cvt to f16x2/bf16x2 (the simulator gets it wrong)", False),
    (re.compile(r"\.(?:relaxed|acquire|release|acq_rel)\.(?:cta|cluster|gpu|sys)\b|\.mmio\b|\bfence\.proxy\b"),
     "memory-model qualifiers on atomics, vectors or other accesses (the simulator cannot parse them; "
     "only scalar ld/st and fence are rewritten)", True),
    (re.compile(r"\bgriddepcontrol\b"), "griddepcontrol (the simulator cannot parse it)", True),
    (APPROX, "approximate math (sin.approx, lg2.approx and the like: the simulator computes them with the host's "
     "math library, the GPU approximates)", False),
]


# What LLVM's PTX (Triton's) writes and this simulator's parser rejects, where dropping it
# changes nothing a functional or timing model computes: launch-bound hints, pointer parameter
# annotations, L1 eviction hints, L2 cache policies (createpolicy and the cache-hint operand
# that carries one); a one-register vector operand ({ %r1 }) is that register.
_HINTS = [(re.compile(r"^\s*createpolicy\.[^;\n]*;[ \t]*$", re.M), ""),
          (re.compile(r"\.L2::cache_hint([^;\n]*),\s*%\w+\s*;"), r"\1;"),
          (re.compile(r"^\s*\.(?:reqntid|maxntid|minnctapersm|maxnreg)\b[^\n{]*", re.M), ""),
          (re.compile(r"(\.param\s+\.\w+)\s+\.ptr(?:\s+\.(?:global|shared|const|local))?(?:\s+\.align\s+\d+)?"), r"\1"),
          (re.compile(r"\.L1::(?:evict_last|evict_first|evict_normal|evict_unchanged|no_allocate)"), ""),
          (re.compile(r"\{\s*(%\w+)\s*\}"), r"\1"),
          # DWARF sections (Triton's): the parser rejects a second module's, merged into one file
          (re.compile(r"^[ \t]*\.section[ \t]+\.debug_\w+\s*\{(?:[ \t]*\}|.*?^[ \t]*\})[ \t]*$", re.M | re.S), "")]


def for_sim(ptx: str) -> str:
    """The PTX with the constructs above rewritten for the simulator's parser, its memory-model
    qualifiers as volatile accesses and fences (ordering()), and its warp shuffles as shared-memory
    exchanges (shuffles())."""
    for rx, to in _HINTS:
        ptx = rx.sub(to, ptx)
    return shuffles(immediates(ordering(ptx)))


# The simulator's lexer reads an integer literal into a C int: a 64-bit instruction's immediate
# outside int32 loses its upper half (cuSOLVER's `sub.s64 %rd31, 9214364837600034816, %rd30`
# became 0 - %rd30), and it aborts on the `U` suffix (CUB's `prmt.b32 ..., 0x3340U`). The suffix
# goes (the value is the same); such a 64-bit immediate is built in a register from its two
# 32-bit halves, which the lexer reads whole.
_U = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)U\b")
_INSN = re.compile(r"^([ \t]*)(@!?%\w+[ \t]+)?([a-z][\w:]*(?:\.[\w:]+)*)([ \t]+)([^;\n]*);", re.M)
_IMM = re.compile(r"(?<![\w.%$])(-?)(0[xX][0-9a-fA-F]+|\d+)(?![\w.])")
_I64 = re.compile(r"\.[bsu]64\b")


def _wide(ops: str) -> List[int]:
    """The int64 immediates outside int32 among an instruction's operands (not in [addresses])."""
    out = []
    for part in re.split(r"\[[^\]]*\]", ops):
        for m in _IMM.finditer(part):
            v = int(m.group(2), 0) * (-1 if m.group(1) else 1)
            if not -(1 << 31) <= v < (1 << 31):
                out.append(v)
    return out


_VEC = re.compile(r"\{([^{}]*)\}")


def _vector(i: str, op: str, ops: str) -> Tuple[List[str], str]:
    """A store's vector operand with immediate elements ({%r1, 0}: the parser wants registers),
    each moved into a register of the element's width first."""
    w = re.search(r"\.v[24]\.[bsuf](8|16|32|64)$", op)
    if not op.startswith("st.") or not w:
        return [], ops
    pre: List[str] = []

    def elems(vm: "re.Match") -> str:
        out = []
        for e in vm.group(1).split(","):
            e = e.strip()
            if re.fullmatch(r"-?(?:0[xX][0-9a-fA-F]+|\d+)|0[dDfF][0-9a-fA-F]+", e):
                bits = {"8": "16", "16": "16"}.get(w.group(1), w.group(1))    # b8 stores from b16 registers
                r = f"%cs_iv{dict(zip(('16', '32', '64'), 'hwd'))[bits]}{len(pre)}"
                pre.append(f"mov.b{bits} {r}, {e};")
                e = r
            out.append(e)
        return "{" + ", ".join(out) + "}"
    ops = _VEC.sub(elems, ops)
    return pre, ops


def _hoist(m: "re.Match") -> str:
    i, guard, op, sp, ops = m.groups()
    vpre, ops = _vector(i, op, ops)
    if vpre:
        return "\n".join(i + l for l in vpre) + f"\n{i}{guard or ''}{op}{sp}{ops};"
    if not _I64.search(op) or len(_wide(ops)) not in (1, 2):
        return m.group(0)
    pre, k = [], [0]

    def reg(im: "re.Match") -> str:
        v = int(im.group(2), 0) * (-1 if im.group(1) else 1)
        if -(1 << 31) <= v < (1 << 31):
            return im.group(0)
        v &= (1 << 64) - 1
        r = f"%cs_im{k[0]}"
        k[0] += 1
        pre.extend([f"mov.b32 %cs_iw0, 0x{v & 0xFFFFFFFF:08x};", f"mov.b32 %cs_iw1, 0x{v >> 32:08x};",
                    f"cvt.u64.u32 {r}, %cs_iw0;", "cvt.u64.u32 %cs_im2, %cs_iw1;", "shl.b64 %cs_im2, %cs_im2, 32;",
                    f"or.b64 {r}, {r}, %cs_im2;"])
        return r
    parts = re.split(r"(\[[^\]]*\])", ops)
    ops = "".join(x if x.startswith("[") else _IMM.sub(reg, x) for x in parts)
    return "\n".join(i + l for l in pre) + f"\n{i}{guard or ''}{op}{sp}{ops};"


def immediates(ptx: str) -> str:
    """Integer literals the simulator's lexer reads wrong, and immediates in a store's vector
    operand, rewritten (above)."""
    ptx = _U.sub(r"\1", ptx)
    heads = list(_FUNC.finditer(ptx))
    out, last = [], 0
    for n, h in enumerate(heads):
        end = heads[n + 1].start() if n + 1 < len(heads) else len(ptx)
        body = ptx[h.end():end]
        new = _INSN.sub(_hoist, body)
        if new == body:
            continue
        out += [ptx[last:h.end()], "\n\t.reg .b64 %cs_im<3>;\n\t.reg .b32 %cs_iw<2>;\n\t.reg .b32 %cs_ivw<4>;\n"
                "\t.reg .b64 %cs_ivd<4>;\n\t.reg .b16 %cs_ivh<4>;\n", new]
        last = end
    out.append(ptx[last:])
    return "".join(out)


# The parser knows neither memory-model qualifiers (.relaxed/.acquire/.release with a scope) nor
# fence. Each becomes what the PTX memory model makes it equal to or stronger than: ld/st.volatile
# is a relaxed access at .sys scope; acquire is a relaxed load followed by a fence, release a fence
# followed by a relaxed store; membar.{cta,gl,sys} is fence.sc at that scope (stronger than
# acq_rel). The fence is unguarded: an extra fence only orders more. Loads and stores of vectors
# and atomics keep their qualifiers and stay refused (MEMORY_MODEL below).
_BAR = {"cta": "membar.cta", "cluster": "membar.gl", "gpu": "membar.gl", "sys": "membar.sys"}
_LDST = re.compile(r"^([ \t]*)(@!?%\w+[ \t]+)?(ld|st)((?:\.(?:global|shared(?:::cta)?))?)\.(relaxed|acquire|release)"
                   r"\.(cta|cluster|gpu|sys)((?:\.(?:global|shared(?:::cta)?))?)(\.[bsuf](?:8|16|32|64))[ \t]+([^;\n]*);", re.M)
_FENCE = re.compile(r"\bfence\.(?:sc|acq_rel)\.(cta|cluster|gpu|sys)[ \t]*;")
# griddepcontrol (programmatic dependent launch): the simulator runs a stream's grids one after
# the other, so every prerequisite grid has ended and written its memory before .wait; launching
# dependents early is a scheduling hint.
_PDL = re.compile(r"^[ \t]*griddepcontrol\.(?:wait|launch_dependents)[ \t]*;[ \t]*$", re.M)


def _access(m: "re.Match") -> str:
    i, guard, op, sp1, sem, scope, sp2, ty, rest = m.groups()
    if (sem == "acquire" and op != "ld") or (sem == "release" and op != "st"):
        return m.group(0)
    acc = f"{i}{guard or ''}{op}.volatile{sp1 or sp2}{ty} {rest};"
    if sem == "acquire":
        return f"{acc}\n{i}{_BAR[scope]};"
    if sem == "release":
        return f"{i}{_BAR[scope]};\n{acc}"
    return acc


# GPGPU-Sim's functional mode takes a membar for a CTA barrier arrival: where only some warps run
# one (a thread publishing a result, as cuSOLVER's getrf_pivot does before its barrier), every later
# bar.sync releases a warp one barrier early and it reads shared memory not yet written. Its
# functional memory is sequentially consistent, so the fence orders nothing there: functional
# mode drops it. Performance mode keeps it (it waits for the warp's stores, as the GPU does).
_MEMBAR = re.compile(r"(?:@!?%\w+[ \t]+)?\bmembar\.(?:cta|gl|sys)[ \t]*;")


def for_mode(ptx: str, mode: str) -> str:
    """The simulator's PTX (for_sim) as the mode runs it: functional mode without membar (above)."""
    return _MEMBAR.sub("", ptx) if mode == "functional" else ptx


def ordering(ptx: str) -> str:
    """Scalar ld/st with .relaxed/.acquire/.release, fence.sc/.acq_rel and griddepcontrol in
    forms the simulator parses, with the same or stronger ordering (above)."""
    if "relaxed" not in ptx and "acquire" not in ptx and "release" not in ptx and "fence" not in ptx \
            and "griddepcontrol" not in ptx:
        return ptx
    ptx = _LDST.sub(_access, ptx)
    ptx = _FENCE.sub(lambda m: _BAR[m.group(1)] + ";", ptx)
    return _PDL.sub("", ptx)


# GPGPU-Sim's shfl writes some lanes' results into other threads' registers (a Triton softmax's
# shfl.sync.bfly destination read back undefined), so each `shfl[.sync].MODE.b32 d, a, b, c[, m]`
# becomes the exchange PTX defines, through one shared word per thread of the CTA: each lane
# stores a, computes its source lane j from b and c (and its own lane when j is out of range),
# and loads j's word (`d|p`: p says whether j was in range). A warp runs in lockstep on the
# simulator, so every store precedes every load.
_SHFL = re.compile(r"^([ \t]*)(@!?%\w+[ \t]+)?shfl(?:\.sync)?\.(up|down|bfly|idx)\.b32[ \t]+(%\w+)(?:[ \t]*\|[ \t]*(%\w+))?[ \t]*,"
                   r"[ \t]*([^,;|]+?)[ \t]*,[ \t]*([^,;]+?)[ \t]*,[ \t]*([^,;]+?)(?:[ \t]*,[ \t]*[^,;]+?)?[ \t]*;", re.M)
_FUNC = re.compile(r"(?:\.(?:visible|weak|extern)[ \t]+)*\.(?:entry|func)\b[^{;]*\{")
_J = {"bfly": "xor.b32 %cs_sh9, %cs_sh1, %cs_sh2;\n{i}setp.le.s32 %cs_shp0, %cs_sh9, %cs_sh8;",
      "down": "add.s32 %cs_sh9, %cs_sh1, %cs_sh2;\n{i}setp.le.s32 %cs_shp0, %cs_sh9, %cs_sh8;",
      "up": "sub.s32 %cs_sh9, %cs_sh1, %cs_sh2;\n{i}setp.ge.s32 %cs_shp0, %cs_sh9, %cs_sh8;",
      "idx": "not.b32 %cs_sh10, %cs_sh4;\n{i}and.b32 %cs_sh10, %cs_sh2, %cs_sh10;\n{i}or.b32 %cs_sh9, %cs_sh7, %cs_sh10;\n"
             "{i}setp.le.s32 %cs_shp0, %cs_sh9, %cs_sh8;"}


def _slot(buf: str) -> List[str]:
    """The thread's index in its CTA (%cs_sh0), its lane (%cs_sh1), the array (%cs_sh5) and the
    thread's word in it (%cs_sh6)."""
    return ["mov.u32 %cs_sh0, %tid.x;", "mov.u32 %cs_sh1, %tid.y;", "mov.u32 %cs_sh2, %tid.z;",
            "mov.u32 %cs_sh3, %ntid.x;", "mov.u32 %cs_sh4, %ntid.y;",
            "mad.lo.u32 %cs_sh2, %cs_sh2, %cs_sh4, %cs_sh1;", "mad.lo.u32 %cs_sh0, %cs_sh2, %cs_sh3, %cs_sh0;",
            "and.b32 %cs_sh1, %cs_sh0, 31;", f"mov.u32 %cs_sh5, {buf};", f"add.u32 %cs_sh5, %cs_sh5, {SCRATCH_AT};",
            "shl.b32 %cs_sh6, %cs_sh0, 2;", "add.u32 %cs_sh6, %cs_sh5, %cs_sh6;"]


# ldmatrix (non-transposed: Triton converts layouts with it) does not parse: thread t of the warp
# gets the word (t%4) of row t/4 of each 8x8 b16 matrix k, whose row addresses lanes 8k..8k+7
# give. Each lane stores its address in its word of the array; each reads its row's address
# there, then the data. `.trans` stays refused.
_LDM = re.compile(r"^([ \t]*)(@!?%\w+[ \t]+)?ldmatrix\.sync\.aligned\.m8n8\.x(1|2|4)(?:\.shared(?:::cta)?)?\.b16[ \t]+"
                  r"(\{[^}]*\}|%\w+)[ \t]*,[ \t]*\[[ \t]*(%r\w*)[ \t]*(?:\+[ \t]*(-?\d+))?[ \t]*\][ \t]*;", re.M)


def _matrix(m: "re.Match", buf: str) -> str:
    i, guard, n, dsts, a, off = m.group(1), m.group(2) or "", int(m.group(3)), m.group(4), m.group(5), m.group(6)
    ds = [x.strip() for x in dsts.strip("{} \t").split(",")]
    if len(ds) != n or not all(re.fullmatch(r"%\w+", x) for x in ds):
        return m.group(0)
    lines = [LDM_NOTE] + _slot(buf) + [
        f"add.u32 %cs_sh11, {a}, {off or 0};", f"{guard}st.shared.b32 [%cs_sh6], %cs_sh11;",
        "shr.u32 %cs_sh9, %cs_sh1, 2;", "sub.s32 %cs_sh10, %cs_sh0, %cs_sh1;", "add.s32 %cs_sh9, %cs_sh9, %cs_sh10;",
        "and.b32 %cs_sh7, %cs_sh1, 3;", "shl.b32 %cs_sh7, %cs_sh7, 2;"]
    for k, d in enumerate(ds):
        lines += [f"add.s32 %cs_sh10, %cs_sh9, {8 * k};", "shl.b32 %cs_sh10, %cs_sh10, 2;",
                  "add.u32 %cs_sh10, %cs_sh5, %cs_sh10;", "ld.shared.b32 %cs_sh8, [%cs_sh10];",
                  "add.u32 %cs_sh8, %cs_sh8, %cs_sh7;", f"{guard}ld.shared.b32 {d}, [%cs_sh8];"]
    return "\n".join(i + l for l in lines)


def _exchange(m: "re.Match", buf: str) -> str:
    i, guard, mode, d, p, a, b, c = (m.group(1), m.group(2) or "", m.group(3), m.group(4), m.group(5), m.group(6),
                                     m.group(7), m.group(8))
    lines = [SHFL_NOTE] + _slot(buf) + [
             f"mov.b32 %cs_sh11, {a};", f"{guard}st.shared.b32 [%cs_sh6], %cs_sh11;",
             f"mov.b32 %cs_sh2, {b};", "and.b32 %cs_sh2, %cs_sh2, 31;",
             f"mov.b32 %cs_sh3, {c};", "shr.u32 %cs_sh4, %cs_sh3, 8;", "and.b32 %cs_sh4, %cs_sh4, 31;",
             "and.b32 %cs_sh3, %cs_sh3, 31;", "and.b32 %cs_sh7, %cs_sh1, %cs_sh4;",
             "not.b32 %cs_sh8, %cs_sh4;", "and.b32 %cs_sh8, %cs_sh3, %cs_sh8;", "or.b32 %cs_sh8, %cs_sh7, %cs_sh8;",
             _J[mode].format(i=i), "selp.b32 %cs_sh9, %cs_sh9, %cs_sh1, %cs_shp0;",
             "sub.s32 %cs_sh10, %cs_sh0, %cs_sh1;", "add.s32 %cs_sh10, %cs_sh10, %cs_sh9;",
             "shl.b32 %cs_sh10, %cs_sh10, 2;", "add.u32 %cs_sh10, %cs_sh5, %cs_sh10;",
             f"{guard}ld.shared.b32 {d}, [%cs_sh10];"] + ([f"{guard}mov.pred {p}, %cs_shp0;"] if p else [])
    return "\n".join(i + l for l in lines)


# The words live in dynamic shared memory past any CTA's own: the simulator places static and
# dynamic (extern) shared arrays from the same start, so an array of ours would overlap a kernel's
# dynamic shared memory (Triton's); no GPU gives a CTA 256 KiB.
SCRATCH_AT = 256 << 10


def shuffles(ptx: str) -> str:
    """Every function's 32-bit warp shuffles and non-transposed ldmatrix rewritten as shared-memory
    exchanges (above), with the registers they use and the words (one per thread of a CTA, 1024
    at most) at SCRATCH_AT."""
    if "shfl" not in ptx and "ldmatrix" not in ptx:
        return ptx
    heads = list(_FUNC.finditer(ptx))
    out, last = [], 0
    for n, h in enumerate(heads):
        end = heads[n + 1].start() if n + 1 < len(heads) else len(ptx)
        body = ptx[h.end():end]
        buf = f"__cs_shfl_{zlib.crc32((h.group(0) + body).encode()):08x}"
        new, k = _SHFL.subn(lambda m: _exchange(m, buf), body)
        new = _LDM.sub(lambda m: _matrix(m, buf), new)
        if not k and new == body:
            continue
        out += [ptx[last:h.start()], f".extern .shared .align 4 .b32 {buf}[];\n", h.group(0),
                "\n\t.reg .b32 %cs_sh<12>;\n\t.reg .pred %cs_shp<1>;\n", new]
        last = end
    out.append(ptx[last:])
    return "".join(out)


def text(ptx: bytes) -> str:
    return ptx.split(b"\0", 1)[0].decode("utf-8", "replace")


def entries(ptx: str) -> Dict[str, List[Tuple[int, int]]]:
    """Entry name -> [(offset, size)] of its parameters, packed as the driver packs them."""
    out: Dict[str, List[Tuple[int, int]]] = {}
    for m in _ENTRY.finditer(ptx):
        off, layout = 0, []
        for p in _PARAM.finditer(m.group(2)):
            align, ty, count = p.group(1), p.group(2), p.group(3)
            esz = _SIZES.get(ty, 4)
            size = esz * int(count) if count else esz
            a = int(align) if align else esz
            off = -(-off // a) * a
            layout.append((off, size))
            off += size
        out[m.group(1)] = layout
    return out


def bodies(ptx: str) -> Dict[str, str]:
    """Entry name -> its text up to the closing brace of its body (for the construct scan)."""
    out: Dict[str, str] = {}
    ms = list(_ENTRY.finditer(ptx))
    for i, m in enumerate(ms):
        end = ms[i + 1].start() if i + 1 < len(ms) else len(ptx)
        out[m.group(1)] = ptx[m.start():_close(ptx, m.end(), end)]
    return out


def _close(ptx: str, at: int, limit: int) -> int:
    """Just past the closing brace of the body that opens after `at` (limit where none closes
    before it: what lies between entries, comments included, is no entry's)."""
    start = ptx.find("{", at, limit)
    depth, i = 0, start
    while 0 <= i < limit:
        depth += {"{": 1, "}": -1}.get(ptx[i], 0)
        if depth == 0:
            return i + 1
        i += 1
    return limit


def constructs(body: str) -> List[Tuple[str, Optional[bool]]]:
    """[(construct, refuse)] the simulator mishandles, found in one entry's text."""
    return [(what, refuse) for rx, what, refuse in CONSTRUCTS if rx.search(body)]


def drop_entries(ptx: str, names: List[str]) -> str:
    """The PTX without the named entries (declaration through the closing brace of the body):
    an entry is never called, so nothing else in the module needs it."""
    for name in names:
        m = re.search(rf"^[ \t]*(?:\.(?:visible|weak|extern)[ \t]+)*\.entry\s+{re.escape(name)}\s*\(", ptx, re.M)
        if m:
            ptx = ptx[:m.start()] + ptx[_close(ptx, ptx.find(")", m.end()), len(ptx)):]
    return ptx


def rename_entry(ptx: str, old: str, new: str) -> str:
    return re.sub(rf"(?<![\w$%]){re.escape(old)}(?![\w$%])", new, ptx)


def merge(modules: List[str]) -> str:
    """One PTX file of several modules: the highest .version and .target of them (PTX is
    backward compatible), 64-bit addresses, every module's body."""
    if not modules:
        return ""
    vers = [tuple(map(int, v)) for m in modules for v in re.findall(r"^\s*\.version\s+(\d+)\.(\d+)", m, re.M)]
    sms = [t for t in (target_sm(m) for m in modules) if t]
    head = [f".version {max(vers)[0]}.{max(vers)[1]}" if vers else "",
            f".target sm_{max(sms)}" if sms else "", ".address_size 64"]
    return "\n".join(h for h in head if h) + "\n" + "\n".join(_HEADER.sub("", m) for m in modules) + "\n"


def target_sm(ptx: str) -> Optional[int]:
    m = re.search(r"\.target\s+sm_(\d+)", ptx)
    return int(m.group(1)) if m else None


# Module-scope variables (__device__, __constant__): the simulator's PTX loader gives each its own
# address in its global memory and copies in its initializer. `.extern` ones and arrays of
# unstated size have no storage of their own here.
_VAR = re.compile(r"^[ \t]*((?:\.(?:visible|extern|weak)[ \t]+)*)\.(global|const)[ \t]+(?:\.align[ \t]+\d+[ \t]+)?"
                  r"(?:\.v(\d)[ \t]+)?\.(\w+)[ \t]+([A-Za-z_$%][\w$%]*)((?:[ \t]*\[\d*\])*)", re.M)
PROBE = "__cudasnap_globals"
_VAR_SIZES = dict(_SIZES, f16=2, bf16=2, f16x2=4, bf16x2=4)


def variables(ptx: str) -> Dict[str, Tuple[str, Optional[int]]]:
    """Name -> (space, bytes) of each module-scope .global/.const variable; bytes None where the
    module gives it no storage (.extern, an array without a size)."""
    out: Dict[str, Tuple[str, Optional[int]]] = {}
    depth, last = 0, 0
    for m in _VAR.finditer(ptx):
        depth += ptx.count("{", last, m.start()) - ptx.count("}", last, m.start())
        last = m.start()
        if depth > 0:                # inside a function: not the module's
            continue
        size: Optional[int] = _VAR_SIZES.get(m.group(4), 0) * int(m.group(3) or 1) or None
        for d in re.findall(r"\[(\d*)\]", m.group(6)):
            size = size * int(d) if size is not None and d else None
        out[m.group(5)] = (m.group(2), None if "extern" in m.group(1) else size)
    return out


def probe(names: List[str]) -> str:
    """An entry that writes the address of each named variable, in order, to its one parameter
    (the simulator's addresses, asked once: its runtime has no lookup by name)."""
    body = [f"\tmov.u64 %cs_g1, {n};\n\tst.global.u64 [%cs_g0+{8 * i}], %cs_g1;" for i, n in enumerate(names)]
    return (f".visible .entry {PROBE}(.param .u64 {PROBE}_out)\n{{\n\t.reg .b64 %cs_g<2>;\n"
            f"\tld.param.u64 %cs_g0, [{PROBE}_out];\n" + "\n".join(body) + "\n\tret;\n}\n")
