"""capture --keep-ptx xla: XLA's PTX dump asked for through XLA_FLAGS, each loaded cubin matched to
the dumped PTX of its kernels, recorded with the module and run on GPGPU-Sim. The program
(tests/double/progs/xlaprog.c) does what XLA does: writes a module's PTX into the directory
--xla_dump_to names, then loads the cubin made from it from memory."""
from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from double import fixtures
from simbuild import SIM, needs_sim

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sim"
KERNELS = ("fill", "add_one", "saxpy", "tile_sum", "histo", "chase")      # kernels.ptx's entries




def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def cubin(kernels=KERNELS, entry_flag=True, double=True) -> bytes:
    """An sm_90 CUDA ELF as ptxas writes one: .text.K and .nv.info.K per kernel, a symbol table
    whose kernel symbols carry STO_CUDA_ENTRY; one more section holds the double's image (the
    kernels the double runs), which the double finds by its first bytes."""
    names = [b""]
    secs = []                                   # (name, type, data, link, entsize)

    def name(s: bytes) -> int:
        names.append(s)
        return sum(len(n) + 1 for n in names[:-1])
    text = b"CUDADOUBLE\n" + b"".join(b"kernel %s\n" % k.encode() for k in KERNELS)
    if double:
        secs.append((b".nv.double", 1, text + b"\0", 0, 0))
    first = len(secs) + 4                       # null, .shstrtab, .strtab, .symtab come first
    strtab = b"\0"
    syms = bytes(24)
    for i, k in enumerate(kernels):
        secs.append((b".text." + k.encode(), 1, bytes(16), 0, 0))
        secs.append((b".nv.info." + k.encode(), 0x70000000, bytes(8), 0, 0))
        syms += struct.pack("<IBBHQQ", len(strtab), 0x12, 0x10 if entry_flag else 0, first + 2 * i, 0, 16)
        strtab += k.encode() + b"\0"
    secs = [(b".shstrtab", 3, None, 0, 0), (b".strtab", 3, strtab, 0, 0), (b".symtab", 2, syms, 2, 24)] + secs
    heads = [(0, 0, 0, 0, 0)]
    for nm, typ, data, link, ent in secs:
        heads.append((name(nm), typ, data, link, ent))
    shstr = b"".join(n + b"\0" for n in names)
    body, offs = b"", []
    for _n, typ, data, _l, _e in heads:
        data = shstr if typ == 3 and data is None else (data or b"")
        offs.append((64 + len(body), len(data)))
        body += data + bytes(-len(data) % 8)
    shoff = 64 + len(body)
    ident = b"\x7fELF\x02\x01\x01\x33\x07" + bytes(7)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0x005A005A, 64, 0, 0, 64, len(heads), 1)
    sh = b""
    for (nm, typ, _d, link, ent), (off, size) in zip(heads, offs):
        sh += struct.pack("<IIQQQQIIQQ", nm, typ, 0, 0, off if typ else 0, size if typ else 0, link, 0, 1, ent)
    return head + body + sh


def test_cubin_kernels_and_xla_flags():
    from cudasnap.capture.jitptx import cubin_entry_names, ptx_entry_names, with_xla_dump, xla_flags_dump_dir
    assert cubin_entry_names(cubin()) == frozenset(KERNELS)
    assert cubin_entry_names(cubin(("a", "b"), entry_flag=False)) == {"a", "b"}     # by their .nv.info
    assert cubin_entry_names(cubin()[:200]) is None and cubin_entry_names(b"\x7fELF" + bytes(60)) is None
    assert cubin_entry_names((DATA / "kernels.ptx").read_bytes()) is None
    assert ptx_entry_names((DATA / "kernels.ptx").read_bytes()) == frozenset(KERNELS)
    assert ptx_entry_names((DATA / "triton_add_one.ptx").read_bytes()) == {"add_one"}
    assert xla_flags_dump_dir("--xla_gpu_autotune_level=0") is None
    assert xla_flags_dump_dir("--xla_dump_to=/a --xla_dump_hlo_as_text --xla_dump_to='/b c'") == "/b c"
    assert with_xla_dump("  --xla_gpu_autotune_level=0 ", "/t/d") == "--xla_gpu_autotune_level=0 --xla_dump_to=/t/d"
    assert with_xla_dump("", "/t/d e") == "--xla_dump_to='/t/d e'"


def test_a_cubin_gets_the_ptx_written_last_before_its_load(tmp_path):
    """Of the dumped PTX files whose entries are the cubin's kernels, the latest one written
    before the load; a file written after it (a later compilation) or with other entries is not
    taken; the same image loaded again gets the same PTX."""
    from cudasnap.capture.jitptx import XlaDump
    ptx = (DATA / "kernels.ptx").read_bytes()
    for name, text, t in (("module_0001.jit_a.ptx", ptx + b"// a\n", 100), ("module_0002.jit_b.ptx", ptx, 200),
                          ("module_0003.jit_c.ptx", (DATA / "triton_add_one.ptx").read_bytes(), 250),
                          ("module_0004.jit_d.ptx", ptx + b"// d\n", 400)):
        (tmp_path / name).write_bytes(text)
        os.utime(tmp_path / name, ns=(t * 10**9, t * 10**9))
    d = XlaDump(str(tmp_path))
    text, what, path = d.find("img1", cubin(), 300 * 10**9)
    assert (text, what, Path(path).name) == (ptx, "xla dump", "module_0002.jit_b.ptx")
    assert Path(d.find("img1", None, 50 * 10**9)[2]).name == "module_0002.jit_b.ptx"    # the same image
    assert d.find("img2", cubin(), 50 * 10**9) is None                       # none written before it
    assert d.find("img3", cubin(("add_one", "fill")), 300 * 10**9) is None    # no PTX with these kernels
    assert Path(d.find("img4", cubin(("add_one",)), 300 * 10**9)[2]).name == "module_0003.jit_c.ptx"
    assert d.find("img5", b"not an ELF", 300 * 10**9) is None


@pytest.fixture(scope="module")
def xla(tmp_path_factory):
    """xlaprog under `capture --keep-ptx xla`, the program's XLA_FLAGS set: it dumps the PTX of
    its module (and another module's) before loading the cubin, and a later module's after."""
    d = fixtures.built_double(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("xla")
    (tmp / "tmpdir").mkdir()
    (tmp / "k.cubin").write_bytes(cubin())
    (tmp / "later.ptx").write_bytes((DATA / "kernels.ptx").read_bytes() + b"// a later compilation\n")
    snap = tmp / "xla.cusnap"
    cp = _cli("capture", "-o", snap, "--ring-mb", "16", "--keep-ptx", "xla", "--", d["progs"]["xlaprog"],
              tmp / "k.cubin", f"module_0007.jit_step.ptx={DATA / 'kernels.ptx'}",
              f"module_0003.jit_other.ptx={DATA / 'triton_add_one.ptx'}", f"after:module_0009.jit_step.ptx={tmp / 'later.ptx'}",
              env=dict(d["env"], XLA_FLAGS="--xla_gpu_autotune_level=0", TMPDIR=str(tmp / "tmpdir")), timeout=120)
    assert cp.returncode == 0 and snap.exists(), cp.stdout + cp.stderr
    return {"snap": snap, "cp": cp, "tmp": tmp, "double": d}


def test_the_dump_is_asked_for_and_what_it_gave_said(xla):
    cp, tmp = xla["cp"], xla["tmp"]
    assert "XLAPROG OK" in cp.stdout
    m = re.search(r"^XLA_FLAGS=(.*)$", cp.stdout, re.M)
    assert m and re.fullmatch(r"--xla_gpu_autotune_level=0 --xla_dump_to=\S+/tmpdir/cudasnap-xla-\w+", m.group(1)), cp.stdout
    assert "PTX kept for 1 of 1 cubin modules (xla dump: 1)" in cp.stderr, cp.stderr
    assert list((tmp / "tmpdir").iterdir()) == []                  # the dump, removed after


def test_the_module_carries_the_ptx_dumped_before_its_load(xla):
    from cudasnap.formats import SnapshotReader
    from cudasnap.formats.jitptx import kept_ptx
    (got,) = kept_ptx(SnapshotReader(str(xla["snap"]))).values()
    assert got["from"] == "xla dump" and got["path"].endswith("/module_0007.jit_step.ptx")
    assert got["ptx"] == (DATA / "kernels.ptx").read_bytes()
    info = _cli("info", xla["snap"])
    assert info.returncode == 0, info.stderr
    assert re.search(r"cubin .*sm_90 .*xla dump", info.stdout), info.stdout
    assert re.search(r"saxpy .*\b1\b.*xla dump", info.stdout), info.stdout


@needs_sim
def test_the_xla_module_runs_on_the_simulator(xla):
    cp = _cli("replay", xla["snap"], "--sim", "gpgpu-sim", "--sim-path", SIM)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert re.search(r"D2H verified\s+3 \(", cp.stdout) and "OK: every recorded D2H result reproduced" in cp.stdout


def test_a_dump_directory_given_or_already_asked_for_is_kept(xla):
    d, tmp = xla["double"], xla["tmp"]
    prog = [d["progs"]["xlaprog"], tmp / "k.cubin", f"module_0001.jit_f.ptx={DATA / 'kernels.ptx'}"]
    mine = tmp / "mine"
    cp = _cli("capture", "-o", tmp / "a.cusnap", "--ring-mb", "16", "--keep-ptx", f"xla={mine}", "--", *prog,
              env=d["env"], timeout=120)
    assert cp.returncode == 0 and "PTX kept for 1 of 1 cubin modules (xla dump: 1)" in cp.stderr, cp.stdout + cp.stderr
    assert f"XLA_FLAGS=--xla_dump_to={mine}\n" in cp.stdout and (mine / "module_0001.jit_f.ptx").is_file()
    theirs = tmp / "theirs"
    cp = _cli("capture", "-o", tmp / "b.cusnap", "--ring-mb", "16", "--keep-ptx", "xla", "--", *prog,
              env=dict(d["env"], XLA_FLAGS=f"--xla_dump_to={theirs}"), timeout=120)
    assert cp.returncode == 0 and "PTX kept for 1 of 1 cubin modules (xla dump: 1)" in cp.stderr, cp.stdout + cp.stderr
    assert f"XLA_FLAGS=--xla_dump_to={theirs}\n" in cp.stdout and (theirs / "module_0001.jit_f.ptx").is_file()


def test_no_xla_in_the_program(xla):
    """A program that loads no cubin, or whose cubin no dumped PTX matches, is said so."""
    d, tmp = xla["double"], xla["tmp"]
    cp = _cli("capture", "-o", tmp / "c.cusnap", "--ring-mb", "16", "--keep-ptx", "xla", "--", d["progs"]["xlaprog"],
              tmp / "k.cubin", env=d["env"], timeout=120)
    assert cp.returncode == 0 and "XLAPROG OK" in cp.stdout, cp.stdout + cp.stderr
    assert "PTX kept for 0 of 1 cubin modules" in cp.stderr, cp.stderr
    assert "--keep-ptx xla: no loaded cubin matched a PTX file of XLA's dump" in cp.stderr


@pytest.mark.parametrize("args, env, says", [
    (["--keep-ptx", "numba"], {}, "--keep-ptx takes xla or xla=DIR, not 'numba'"),
    (["--keep-ptx", "xla=/x/y"], {"XLA_FLAGS": "--xla_dump_to=/other"},
     "--keep-ptx xla=/x/y: XLA_FLAGS already dumps to /other; give that directory or drop the flag"),
])
def test_bad_keep_ptx_is_one_line(xla, args, env, says):
    d = xla["double"]
    cp = _cli("capture", "-o", xla["tmp"] / "bad.cusnap", *args, "--", d["progs"]["xlaprog"], xla["tmp"] / "k.cubin",
              env=dict(d["env"], **env), timeout=60)
    assert cp.returncode == 2 and cp.stderr.strip().endswith(says) and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "XLAPROG" not in cp.stdout


def test_the_tap_keeps_cubins_only():
    """The recorder's tap copies a cubin's chunks (the first starts as an ELF; a full 4 MiB one
    goes on in the next) until their blob is named, and passes every chunk on to the writer."""
    from cudasnap.capture.jitptx import ImageTap

    class Sink:
        def __init__(self):
            self.got, self.n = [], 0

        def put_chunk(self, digest, data, release=None):
            self.got.append(digest)

        def add_blob_chunks(self, size, digests):
            self.n += 1
            return f"b{self.n}"
    sink = Sink()
    tap = ImageTap(sink)
    big = b"\x7fELF" + bytes(ImageTap.CHUNK - 4)
    for d, data in ((b"1", big), (b"2", b"tail"), (b"3", b"not code"), (b"4", b"\x7fELF small")):
        tap.put_chunk(d, memoryview(data))
    assert sink.got == [b"1", b"2", b"3", b"4"] and set(tap.chunks) == {b"1", b"2", b"4"}
    assert tap.add_blob_chunks(len(big) + 4, [b"1", b"2"]) == "b1" and tap.add_blob_chunks(8, [b"3"]) == "b2"
    assert tap.add_blob_chunks(10, [b"4"]) == "b3" and tap.cubins == {"b1", "b3"}
    assert tap.take("b1") == big + b"tail" and tap.take("b1") is None and tap.take("b2") is None
    assert tap.take("b3") == b"\x7fELF small" and tap.chunks == {} and tap.held == 0
