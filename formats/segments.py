"""Segment files: where a SnapshotWriter spills large chunk frames while the snapshot file is
busy (formats/writer.py says why), and how they are folded back in. A segment is
`<snapshot>.seg<k>`: a preamble, then chunk frames, nothing else (formats/SCHEMA.md)."""
from __future__ import annotations

import errno
import glob
import os
from typing import List, Tuple

from .container import FORMAT_VERSION, PREAMBLE_SIZE, pack_preamble

_FOLD_PIECE = 64 << 20        # copy_file_range step when folding segments in


def segment_paths(path) -> List[str]:
    """The segment files a writer of `path` left beside it, in order."""
    base = os.fspath(path)
    found = [p for p in glob.glob(glob.escape(base) + ".seg*") if p[len(base) + 4:].isdigit()]
    return sorted(found, key=lambda p: int(p[len(base) + 4:]))


class Segment:
    """One segment file: written by one thread at a time (the writer hands out free ones)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
        os.pwrite(self.fd, pack_preamble(FORMAT_VERSION), 0)
        self.pos = PREAMBLE_SIZE
        self.frames: List[Tuple[int, int, str]] = []     # (offset, comp_len, chunk id)


def copy_range(src: int, src_off: int, dst: int, dst_off: int, n: int) -> None:
    """Copy n bytes between files in the kernel (copy_file_range), else by read + write."""
    while n > 0:
        step = min(n, _FOLD_PIECE)
        try:
            got = os.copy_file_range(src, dst, step, src_off, dst_off)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):   # copy by hand
                raise
            data = os.pread(src, step, src_off)
            got = os.pwrite(dst, data, dst_off) if data else 0
        if got <= 0:
            raise OSError(errno.EIO, "segment shorter than written")
        src_off += got
        dst_off += got
        n -= got
