"""`cudasnap replay --wrap 'TOOL ARGS' / --preload TOOL.so`: the replay run under an injection
tool (compute-sanitizer, Nsight Compute, Nsight Systems, an NVBit tool).

Only how the replay process starts changes: this process execs

    TOOL ARGS [ADDED] python -m cudasnap replay <the same arguments, less --wrap/--preload>

with the environment it has, so the tool's exit status is the command's (the replay's own,
unless the tool says otherwise). ADDED are the options that make a known tool do what the replay
asks, each only when the wrap string does not set it already:
- compute-sanitizer: `--error-exitcode 1`, so errors it reports make the exit non-zero (by
  default it returns the application's status, and a replay that reproduced a recorded fault
  exits 0);
- with `--profiler-range workload`: ncu `--profile-from-start off`, nsys profile
  `--capture-range=cudaProfilerApi`, so they see the replayed work and not the replay's set-up.
`--preload` puts the library first in LD_PRELOAD of the replay process only: under a wrapper,
through `sh -c 'LD_PRELOAD=... exec "$@"'` after the tool, so neither the tool's own process gets
it nor is the LD_PRELOAD the tool gives its target (tools inject themselves that way) replaced.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Dict, List, Optional, Sequence, Tuple

DROP = ("--wrap", "--preload")
ELF = b"\x7fELF"


class WrapError(Exception):
    """A --wrap or --preload that cannot run (one line, exit 2)."""


def strip_args(args: Sequence[str], takes_value: Dict[str, bool]) -> List[str]:
    """The command's arguments without --wrap/--preload and their values. takes_value: every
    option name of the command -> whether it takes a value (so a value is never taken for an
    option, and short options may be clustered as click allows: -qc5, -qc 5)."""
    out: List[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        if a.startswith("--"):
            name, eq, _v = a.partition("=")
            if name in DROP:
                i += 1 if eq else 2
                continue
            out.append(a)
            if not eq and takes_value.get(name) and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
        elif a.startswith("-") and len(a) > 1:
            out.append(a)
            for j, ch in enumerate(a[1:], 1):
                if takes_value.get("-" + ch):
                    if j == len(a) - 1 and i + 1 < len(args):
                        out.append(args[i + 1])
                        i += 1
                    break
        else:
            out.append(a)
        i += 1
    return out


def _has(argv: Sequence[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def tool_options(wrap: List[str], workload_range: bool) -> List[str]:
    """Options a known tool needs for the replay's intent (see the module doc)."""
    tool = os.path.basename(wrap[0])
    if tool == "compute-sanitizer" and not _has(wrap, "--error-exitcode"):
        return ["--error-exitcode", "1"]
    if not workload_range:
        return []
    if tool in ("ncu", "nv-nsight-cu-cli") and not _has(wrap, "--profile-from-start"):
        return ["--profile-from-start", "off"]
    if tool == "nsys" and len(wrap) > 1 and wrap[1] == "profile" and not _has(wrap, "--capture-range", "-c"):
        return ["--capture-range=cudaProfilerApi"]
    return []


def _preload_path(preload: str) -> str:
    path = os.path.abspath(os.path.expanduser(preload))
    if not os.path.isfile(path):
        raise WrapError(f"--preload {preload}: no such file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise WrapError(f"--preload {preload}: cannot read it ({e.strerror})")
    if magic != ELF:
        raise WrapError(f"--preload {preload}: not a shared library (no ELF header)")
    return path


def command(args: Sequence[str], takes_value: Dict[str, bool], wrap: Optional[str], preload: Optional[str],
            workload_range: bool, env: Optional[Dict[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """(argv, environment) of the wrapped replay. Raises WrapError."""
    env = dict(os.environ if env is None else env)
    head: List[str] = []
    if wrap is not None:
        try:
            head = shlex.split(wrap)
        except ValueError as e:
            raise WrapError(f"--wrap {wrap!r}: {e}")
        if not head or not head[0]:
            raise WrapError("--wrap: empty command (give the tool and its options, e.g. 'compute-sanitizer --tool memcheck')")
        exe = head[0]
        found = shutil.which(exe, path=env.get("PATH"))
        if found is None:
            where = "not an executable file" if os.sep in exe else "not found on PATH"
            raise WrapError(f"--wrap: {exe}: {where}")
        head = [found, *head[1:], *tool_options(head, workload_range)]
    lib = _preload_path(preload) if preload is not None else None
    replay = [sys.executable, "-m", "cudasnap", "replay", *strip_args(args, takes_value)]
    if lib is not None and head:
        sh = shutil.which("sh", path=env.get("PATH")) or "/bin/sh"
        head += [sh, "-c", 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"', lib]
    elif lib is not None:
        env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    return head + replay, env


def option_arity(cmd) -> Dict[str, bool]:
    """Every option name of a click command -> whether it takes a value."""
    out: Dict[str, bool] = {}
    for p in getattr(cmd, "params", []):
        if getattr(p, "param_type_name", "") != "option":
            continue
        takes = not (getattr(p, "is_flag", False) or getattr(p, "count", False))
        for name in list(p.opts) + list(getattr(p, "secondary_opts", [])):
            out[name] = takes
    return out


def exec_wrapped(ctx, wrap: Optional[str], preload: Optional[str], workload_range: bool) -> int:
    """Replace this process by the wrapped replay; returns 2 (after one line) when it cannot."""
    args = ctx.meta.get("cudasnap.args")
    if args is None:
        sys.stderr.write("cudasnap: error: --wrap/--preload: the command line is not available (use the cudasnap command)\n")
        return 2
    try:
        argv, env = command(args, option_arity(ctx.command), wrap, preload, workload_range)
    except WrapError as e:
        sys.stderr.write(f"cudasnap: error: {e}\n")
        return 2
    if not ctx.params.get("quiet"):
        sys.stderr.write(f"cudasnap: replay under: {shlex.join(argv)}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # a process of its own: --wrap: the tool runs the replay, by design
        os.execve(argv[0], argv, env)
    except OSError as e:
        sys.stderr.write(f"cudasnap: error: --wrap: cannot run {argv[0]}: {e.strerror}\n")
        return 2
    return 2  # not reached
