"""The one rule for every file a command reads: a regular file (or a directory where one is
asked for), checked by type before the first read. A FIFO or a terminal blocks the command,
a character device such as /dev/zero never ends, and kernel files (/proc, /sys) report no
size: each is refused in one line naming the file."""
from __future__ import annotations

import os
import stat
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def input_problem(path: PathLike) -> Optional[str]:
    """Why path cannot be read as an input (None when it can, or when it does not exist: the
    reader names that itself)."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return None
    for test, what in _KINDS:
        if test(st.st_mode):
            return f"{p} is {what}, not a file: give a regular file"
    if stat.S_ISDIR(st.st_mode):
        return None                     # each reader names a directory where a file goes
    real = os.path.realpath(p)
    if real.startswith(("/proc/", "/sys/")):
        return f"{p} is a kernel file ({real}) whose size is unknown: copy it to a regular file first"
    return None


class InputError(ValueError):
    """An input that is not a regular file (one line, exit 2)."""


def check_input(path: PathLike) -> None:
    why = input_problem(path)
    if why:
        raise InputError(why)
