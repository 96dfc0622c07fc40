"""PTX of JIT-compiled modules, kept at capture. Triton (and torch.compile's Triton kernels)
writes each kernel's PTX beside its cubin in its cache (DIR/<hash>/<name>.ptx and .cubin); the
driver sees only the cubin. A loaded image whose bytes equal a cached cubin's gets that PTX
recorded with it (formats/jitptx.py), for the simulator, which runs PTX only. XLA's PTX is kept
only when asked (`capture --keep-ptx xla`: its dump directory, matched by kernel names; below)."""
from __future__ import annotations

import os
import re
import shlex
import struct
from typing import Dict, List, Optional, Tuple

from cudasnap.formats.container import blob_id_of

DIRS_ENV = "CUDASNAP_PTX_DIRS"      # more directories to search, ':'-separated
_DEPTH = 4                           # inductor: DIR/triton/<device>/<hash>/<name>.cubin


def cache_dirs(env: Dict[str, str]) -> List[Tuple[str, str]]:
    """(directory, what it is) to search, from the captured program's environment: Triton's
    cache (TRITON_CACHE_DIR, else TRITON_HOME's or HOME's .triton/cache), torch.compile's
    (TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_USER), and CUDASNAP_PTX_DIRS."""
    out: List[Tuple[str, str]] = []
    if env.get("TRITON_CACHE_DIR"):
        out.append((env["TRITON_CACHE_DIR"], "triton cache"))
    for home in (env.get("TRITON_HOME"), env.get("HOME")):
        if home:
            out.append((os.path.join(home, ".triton", "cache"), "triton cache"))
    user = env.get("USER") or env.get("LOGNAME") or _user()
    ind = env.get("TORCHINDUCTOR_CACHE_DIR") or (f"/tmp/torchinductor_{user}" if user else "")
    if ind:
        out.append((ind, "torch.compile cache"))
    for d in (env.get(DIRS_ENV) or "").split(":"):
        if d:
            out.append((d, DIRS_ENV))
    seen, uniq = set(), []
    for d, what in out:
        d = os.path.abspath(d)
        if d not in seen:
            seen.add(d)
            uniq.append((d, what))
    return uniq


def _user() -> str:
    try:
        import getpass
        return getpass.getuser()
    except Exception:
        return ""


class PtxFinder:
    """Cubins of the cache directories indexed by size; a directory that changed since the
    last walk (a kernel compiled meanwhile) is walked again on a miss."""

    def __init__(self, env: Dict[str, str]):
        self.dirs = cache_dirs(env)
        self.by_size: Dict[int, List[Tuple[str, str]]] = {}
        self.mtimes: Dict[str, float] = {}

    def _walk(self) -> None:
        self.by_size.clear()
        self.mtimes.clear()
        for top, what in self.dirs:
            stack = [(top, 0)]
            while stack:
                d, depth = stack.pop()
                try:
                    self.mtimes[d] = os.stat(d).st_mtime
                    it = list(os.scandir(d))
                except OSError:
                    self.mtimes[d] = -1.0        # not there yet: looked at again on a miss
                    continue
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if depth < _DEPTH:
                                stack.append((e.path, depth + 1))
                        elif e.name.endswith(".cubin"):
                            self.by_size.setdefault(e.stat().st_size, []).append((e.path, what))
                    except OSError:
                        continue

    def _changed(self) -> bool:
        for d, t in self.mtimes.items():
            try:
                if os.stat(d).st_mtime != t:
                    return True
            except OSError:
                if t != -1.0:
                    return True
        return False

    def find(self, image_blob: str, size: int) -> Optional[Tuple[bytes, str, str]]:
        """(PTX, what kept it, the cubin's path) for the image of that blob id and size."""
        if not self.dirs or size <= 0:
            return None
        if not self.mtimes:
            self._walk()
        hit = self._match(image_blob, size)
        if hit is None and self._changed():
            self._walk()
            hit = self._match(image_blob, size)
        return hit

    def _match(self, image_blob: str, size: int) -> Optional[Tuple[bytes, str, str]]:
        for path, what in self.by_size.get(size, ()):
            try:
                with open(path, "rb") as f:
                    if blob_id_of(f.read()) != image_blob:
                        continue
                with open(path[:-len(".cubin")] + ".ptx", "rb") as f:
                    return f.read(), what, path
            except OSError:
                continue
        return None


def program_env(pid: int) -> Dict[str, str]:
    """The process's environment as it started (what its caches are named by)."""
    env: Dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                k, _, v = item.decode("utf-8", "replace").partition("=")
                if k:
                    env[k] = v
    except OSError:
        pass
    return env


# ------------------------------------------------------------------------------------ XLA
# XLA (JAX) writes each module's PTX into --xla_dump_to's directory as
# [PREFIX.]module_NNNN.NAME.ptx (NNNN.NAME.SHARD.ptx when one module is compiled in parts), before
# ptxas turns it into the cubin it loads from memory; no cubin is written. A loaded cubin gets
# the PTX whose .entry names are the cubin's kernels, of the latest such file written before the
# load (XLA's autotuner loads candidates compiled with dumping off, before the module's PTX exists).

XLA_DUMP_FLAG = "--xla_dump_to="
_ENTRY = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$%][\w$%.]*)", re.M)
STO_CUDA_ENTRY = 0x10                # st_other bit of a kernel's symbol in a CUDA ELF


def xla_flags_dump_dir(flags: str) -> Optional[str]:
    """The directory XLA_FLAGS dumps to (the last --xla_dump_to, as XLA's flag parser takes it)."""
    out = None
    for tok in _split_flags(flags):
        if tok.startswith(XLA_DUMP_FLAG):
            out = tok[len(XLA_DUMP_FLAG):]
    return out


def _split_flags(flags: str) -> List[str]:
    try:
        return shlex.split(flags or "")
    except ValueError:
        return (flags or "").split()


def with_xla_dump(flags: str, directory: str) -> str:
    """XLA_FLAGS with a dump to `directory` appended (the program's own flags kept)."""
    flags = (flags or "").strip()
    return (flags + " " if flags else "") + XLA_DUMP_FLAG + shlex.quote(directory)


def ptx_entry_names(text: bytes) -> frozenset:
    return frozenset(m.decode("utf-8", "replace") for m in _ENTRY.findall(text))


def cubin_entry_names(img: bytes) -> Optional[frozenset]:
    """The kernels of a CUDA ELF (64-bit): function symbols marked STO_CUDA_ENTRY, else those
    with a .nv.info.<name> section; None for anything else or a damaged ELF."""
    try:
        if len(img) < 64 or img[:4] != b"\x7fELF" or img[4] != 2 or img[5] != 1:
            return None
        shoff, = struct.unpack_from("<Q", img, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", img, 0x3A)
        if shentsize < 64 or not shoff or shoff + shnum * shentsize > len(img):
            return None
        secs = [struct.unpack_from("<IIQQQQIIQQ", img, shoff + i * shentsize) for i in range(shnum)]

        def cstr(tab: int, off: int) -> str:
            base = secs[tab][4] + off
            end = img.find(b"\0", base, secs[tab][4] + secs[tab][5])
            return img[base:end if end >= 0 else base].decode("utf-8", "replace")

        names = [cstr(shstrndx, s[0]) if shstrndx < shnum else "" for s in secs]
        funcs, marked = set(), set()
        for s in secs:
            if s[1] != 2 or s[9] < 24 or s[6] >= shnum:         # SHT_SYMTAB, its strtab in sh_link
                continue
            for off in range(s[4], s[4] + s[5] - 23, s[9]):
                st_name, st_info, st_other = struct.unpack_from("<IBB", img, off)
                if st_info & 0xF == 2 and st_name:                 # STT_FUNC
                    name = cstr(s[6], st_name)
                    funcs.add(name)
                    if st_other & STO_CUDA_ENTRY:
                        marked.add(name)
        if marked:
            return frozenset(marked)
        info = {n[len(".nv.info."):] for n in names if n.startswith(".nv.info.")}
        return frozenset(funcs & info) or None
    except (struct.error, IndexError):
        return None


class XlaDump:
    """PTX files of an XLA dump directory, matched to loaded cubins by their kernels' names."""

    def __init__(self, directory: str):
        self.dir = directory
        self.files: Dict[str, Tuple[int, int, frozenset]] = {}   # path -> (mtime ns, size, entries)
        self.chosen: Dict[str, str] = {}                          # image blob id -> PTX path

    def _scan(self) -> None:
        # every file stat'ed each time (not skipped on the directory's mtime): a file seen while
        # XLA was still writing it changes its own size and mtime, not the directory's
        try:
            it = list(os.scandir(self.dir))
        except OSError:
            return
        for e in it:
            if not e.name.endswith(".ptx"):
                continue
            try:
                st = e.stat()
                old = self.files.get(e.path)
                if old and old[:2] == (st.st_mtime_ns, st.st_size):
                    continue
                with open(e.path, "rb") as f:
                    self.files[e.path] = (st.st_mtime_ns, st.st_size, ptx_entry_names(f.read()))
            except OSError:
                continue

    def count(self) -> int:
        self._scan()
        return len(self.files)

    def find(self, image_blob: str, image: Optional[bytes], loaded_ns: int) -> Optional[Tuple[bytes, str, str]]:
        """(PTX, "xla dump", its path) for a cubin loaded at loaded_ns (wall clock)."""
        path = self.chosen.get(image_blob)
        if path is None:
            names = cubin_entry_names(image) if image else None
            if not names:
                return None
            self._scan()
            best = None
            for p, (mt, _size, ent) in self.files.items():
                if ent == names and mt <= loaded_ns and (best is None or (mt, p) > best):
                    best = (mt, p)
            if best is None:
                return None
            path = best[1]
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            return None
        self.chosen[image_blob] = path
        return text, "xla dump", path


class ImageTap:
    """Stands between the decoder and the snapshot writer: keeps the bytes of cubins (a chunk
    starting as an ELF, and the full chunks following it) until their load is decoded, so that
    their kernels can be named. Other payloads pass untouched, uncopied."""

    CHUNK = 4 << 20                   # the shim's chunk size: a bigger image goes on in the next
    BUDGET = 256 << 20
    KEEP = 64                         # images not taken (no load followed): the oldest dropped

    def __init__(self, sink):
        self.sink = sink
        self.chunks: Dict[bytes, bytes] = {}
        self.images: Dict[str, bytes] = {}        # blob id -> image, until taken
        self.cubins: set = set()                  # blob ids of ELF images
        self.elf: set = set()                     # digests of chunks starting an ELF
        self.follow = False
        self.held = 0

    def __getattr__(self, name):
        return getattr(self.sink, name)

    def put_chunk(self, digest, data, release=None, **kw):
        elf = bytes(data[:4]) == b"\x7fELF"
        if elf or (self.follow and len(data) > 0):
            self.chunks[bytes(digest)] = bytes(data)
            self.held += len(data)
            while self.held > self.BUDGET and len(self.chunks) > 1:      # chunks no blob claimed
                self.held -= len(self.chunks.pop(next(iter(self.chunks))))
            if elf:
                self.elf.add(bytes(digest))
            self.follow = len(data) >= self.CHUNK
        else:
            self.follow = False
        return self.sink.put_chunk(digest, data, release, **kw)

    def add_blob_chunks(self, size, digests, **kw):
        bid = self.sink.add_blob_chunks(size, digests, **kw)
        ds = [bytes(d) for d in digests]
        if ds and ds[0] in self.elf:
            self.cubins.add(bid)
        if ds and ds[0] in self.chunks and all(d in self.chunks for d in ds):
            self.images[bid] = b"".join(self.chunks[d] for d in ds)[:size]
            while len(self.images) > self.KEEP:
                self.images.pop(next(iter(self.images)))
        for d in ds:
            got = self.chunks.pop(d, None)
            if got is not None:
                self.held -= len(got)
        return bid

    def take(self, bid: str) -> Optional[bytes]:
        return self.images.pop(bid, None)
