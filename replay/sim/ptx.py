"""PTX text as the simulator takes it: entries and their parameter layouts, constructs the
simulator is known to mishandle, and one merged file for the whole replay (the simulator loads
one PTX file per process)."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*\(([^)]*)\)", re.S)
# Triton's (LLVM's) pointer parameters: `.param .u64 .ptr .global .align 1 NAME`
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)(?:\s+\.ptr(?:\s+\.(?:global|shared|const|local))?"
                    r"(?:\s+\.align\s+\d+)?)?\s+[\w$%]+(?:\[(\d+)\])?")
_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "b32": 4, "u32": 4, "s32": 4,
          "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}
_HEADER = re.compile(r"^\s*\.(version|target|address_size)\b.*$", re.M)

# (regex, what, refuse): refuse = the simulator aborts on it or cannot run it at all
CONSTRUCTS: List[Tuple[re.Pattern, str, bool]] = [
    (re.compile(r"\bcp\.async\.bulk\b|\bcp\.reduce\.async\.bulk\b"), "cp.async.bulk (TMA, Hopper)", True),
    (re.compile(r"\bcp\.async\b"), "cp.async (the simulator cannot parse it)", True),
    (re.compile(r"\bdp4a\b|\bdp2a\b"), "dp4a/dp2a (the simulator aborts: not implemented)", True),
    (re.compile(r"\bldmatrix\b|\bstmatrix\b"), "ldmatrix/stmatrix (the simulator cannot parse it)", True),
    (re.compile(r"\bwgmma\b"), "wgmma (Hopper)", True),
    (re.compile(r"\bmbarrier\b"), "mbarrier (Hopper-style barriers)", True),
    (re.compile(r"\bsetmaxnreg\b"), "setmaxnreg (Hopper)", True),
    (re.compile(r"%cluster_|\.cluster\b|\bbarrier\.cluster\b|\.reqnctapercluster|\.explicitcluster"),
     "thread-block clusters (Hopper)", True),
    (re.compile(r"\bshfl\.sync\b"), "shfl.sync (the simulator gives wrong results for some uses)", False),
    (re.compile(r"\bcvt\.\w+\.f16x2\b|\bcvt\.\w+\.bf16x2\b"), "cvt to f16x2/bf16x2 (the simulator gets it wrong)", False),
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
    """The PTX with the constructs above rewritten for the simulator's parser."""
    for rx, to in _HINTS:
        ptx = rx.sub(to, ptx)
    return ptx


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
        out[m.group(1)] = ptx[m.start():end]
    return out


def constructs(body: str) -> List[Tuple[str, bool]]:
    """[(construct, refuse)] the simulator mishandles, found in one entry's text."""
    return [(what, refuse) for rx, what, refuse in CONSTRUCTS if rx.search(body)]


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
