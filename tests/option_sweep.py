"""Bad inputs generated over every command's options, and the promises checked for each.

Cases come in classes, generated from the CLI itself (every numeric option of every command,
every declared Inert option) and from tables of bad selections, paths, files and specs. Each
runs in-process (typer's CliRunner) in a work directory holding the inputs; for each case:

- no traceback (an exception escaping the command);
- the exit code its class expects (2: refused; 126/127: a program that cannot run);
- no input changed: every file of the work directory keeps its bytes, size, mode and mtime,
  and no file appears (an output, an SQLite -wal/-shm) when the command refused;
- a refusal names what is wrong (the option, path or variable);
- an inert option is never accepted silently.

Used by tests/test_option_sweep.py (a sample of each class, in CI) and
bench/sweep_bad_inputs.py (every case; the table in bench/RESULTS.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import typer
from typer.testing import CliRunner

from cudasnap.cli import app

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:                    # click >= 8.2 always separates stderr
    runner = CliRunner()


@dataclass
class Case:
    cls: str
    args: List[str]
    names: str                        # what the refusal must name (in stderr)
    code: Tuple[int, ...] = (2,)
    env: Dict[str, str] = field(default_factory=dict)
    inert: bool = False


# ------------------------------------------------------------------ the work directory

PROFILE = {"summary": {"mode": "timeline"}, "kernels": [], "launches": []}


def prepare(root: Path, env: Dict[str, str], program: str) -> Path:
    """A snapshot of program captured on the test double, its timeline profile, and the inputs
    every case reads, under root; returns the cases' work directory."""
    import subprocess
    import sys
    snap, prof = root / "src.cusnap", root / "src.json"
    cmd = [sys.executable, "-m", "cudasnap"]
    subprocess.run([*cmd, "capture", "-q", "-o", str(snap), "--ring-mb", "16", "--", program],
                   env=env, check=True, capture_output=True, timeout=120)
    subprocess.run([*cmd, "replay", str(snap), "--profile", "timeline", "--out", str(prof), "-q"],
                   env=env, check=True, capture_output=True, timeout=120)
    work = root / "work"
    make_inputs(work, snap, prof)
    return work


def make_inputs(work: Path, snapshot: Path, profile: Optional[Path] = None) -> Dict[str, str]:
    """The inputs every case may name, in work (relative names: cases run there)."""
    import shutil
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(snapshot, work / "snap.cusnap")
    if profile is not None:
        shutil.copy(profile, work / "prof.json")
    else:
        (work / "prof.json").write_text(json.dumps(PROFILE))
    (work / "envs.toml").write_text('[[env]]\nname = "a"\n[[env]]\nname = "b"\nvars = {X = "1"}\n')
    (work / "camp.toml").write_text('[[snapshot]]\npath = "snap.cusnap"\n[[env]]\nname = "a"\n'
                                    '[[env]]\nname = "b"\n')
    (work / "text.txt").write_text("not a snapshot\n")
    (work / "empty.sqlite").write_bytes(b"")
    db = sqlite3.connect(work / "other.sqlite")                  # an SQLite file, not a store
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    from cudasnap.campaign.store import Store
    st = Store(work / "store.sqlite")
    st.close()
    (work / "adir").mkdir(exist_ok=True)
    (work / "prog.sh").write_text("echo hi\n")                    # a text file, not executable
    (work / "noshebang").write_text("echo hi\n")
    os.chmod(work / "noshebang", 0o755)                           # executable, but not a program
    from cudasnap.formats import SnapshotReader, SnapshotWriter
    with SnapshotReader(snapshot) as r:                           # a snapshot of a newer record schema
        w = SnapshotWriter(work / "future.cusnap", dict(r.raw_header, schema=99))
        for rec in r.records():
            if rec.get("k") != "b":
                w.write(rec)
        w.close()
    # special files and links for the fault classes (issue 60): a FIFO, links to the inputs,
    # a directory reached by a link
    if not (work / "fifo").exists():
        os.mkfifo(work / "fifo")
    if not (work / "sock").exists():
        import socket
        sk = socket.socket(socket.AF_UNIX)
        sk.bind(str(work / "sock"))
        sk.close()
    for name, target in (("lnk.cusnap", "snap.cusnap"), ("lnkprof.json", "prof.json"), ("linkdir", ".")):
        if not os.path.lexists(work / name):
            os.symlink(target, work / name)
    for name, target in (("hard.cusnap", "snap.cusnap"), ("hardprof.json", "prof.json"),
                         ("hardstore.sqlite", "store.sqlite")):
        if not os.path.lexists(work / name):
            os.link(work / target, work / name)
    old = 1_600_000_000
    for p in work.iterdir():
        if not p.is_symlink():
            os.utime(p, (old, old))                               # an mtime a touch would move
    return {}


def state(work: Path) -> Dict[str, tuple]:
    out = {}
    for root, dirs, files in os.walk(work):
        for n in dirs + files:
            p = os.path.join(root, n)
            st = os.lstat(p)
            digest = None
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha1(f.read()).hexdigest()
            out[os.path.relpath(p, work)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


@contextmanager
def cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


# ------------------------------------------------------------------ the cases

REQUIRED = {                                      # arguments that make each command otherwise valid
    ("capture",): ["--", "true"], ("info",): ["snap.cusnap"], ("dump",): ["snap.cusnap"],
    ("repair",): ["snap.cusnap"], ("stats",): ["snap.cusnap"], ("api",): [], ("replay",): ["snap.cusnap"],
    ("compare",): ["prof.json", "prof.json"], ("bisect",): ["snap.cusnap", "--envs", "envs.toml"],
    ("export",): ["snap.cusnap", "-o", "exp_out"], ("extract",): ["snap.cusnap", "-o", "ext.cusnap", "--launch", "8"],
    ("advise",): ["snap.cusnap"], ("campaign", "run"): ["camp.toml", "-o", "new.sqlite"],
    ("campaign", "report"): ["store.sqlite"],
}


def commands() -> Iterator[Tuple[Tuple[str, ...], typer.main.click.Command]]:
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            for sub, c in cmd.commands.items():
                yield (name, sub), c
        else:
            yield (name,), cmd


def _tail(path: Tuple[str, ...], opt: List[str]) -> List[str]:
    req = REQUIRED[path]
    if path == ("capture",):                     # options before the program
        return [*path, *opt, *req]
    return [*path, *req, *opt]


def _kind(p):
    """The Python type an option takes (Optional and List unwrapped)."""
    import typing
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    while typing.get_args(ann):
        ann = next(a for a in typing.get_args(ann) if a is not type(None))
    return ann


def _long(p) -> str:
    return next((o for o in p.opts if o.startswith("--")), p.opts[0])


def numeric_cases() -> Iterator[Case]:
    """Every INT/FLOAT option of every command: non-finite, past 64 bits, past its declared
    range, not a number."""
    for path, cmd in commands():
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option" or getattr(p, "is_flag", False):
                continue
            kind = _kind(p)
            if kind not in (int, float):
                continue
            o = _long(p)
            bad = ["nan", "NaN", "inf", "-inf", "1e309", "-1e309", "x", "1,5"]
            if kind is int:
                bad += [str(2**64), str(-2**64), "99999999999999999999", "1.5", "0x10"]
            lo, hi = p.min, p.max
            if lo is not None:
                bad.append(str(lo - 1) if kind is int else str(lo - 0.5))
            if hi is not None:
                bad.append(str(hi + 1) if kind is int else str(hi * 2 + 1))
            for v in bad:
                yield Case("number", _tail(path, [o, v]), o.lstrip("-"))


def _value_for(p) -> List[str]:
    if getattr(p, "is_flag", False):
        return [p.opts[0]] if p.default is False or p.default is None else [
            (p.secondary_opts or p.opts)[0]]
    from enum import Enum
    kind = _kind(p)
    if isinstance(kind, type) and issubclass(kind, Enum):
        v = [c.value for c in kind if c.value != getattr(p.default, "value", p.default)]
        return [p.opts[0], v[0]]
    if kind in (int, float):
        lo = p.min or 0
        return [p.opts[0], str(max(lo, 2) if kind is int else max(lo, 2.0))]
    if p.name in ("kernel_metrics", "metrics") and kind is Path:
        return [p.opts[0], "prof.json"]
    if p.name == "window":
        return [p.opts[0], "nvtx:step"]
    return [p.opts[0], {"address": "auto", "html": "r.html", "out": "o.json", "out_file": "o.json",
                        "keep": "keepdir", "trace": "t.json", "keep_ptx": "xla"}.get(p.name, "x.json")]


# what turns off the option an Inert rule depends on, where the default turns it on
INERT_CONTEXT = {("bisect", "repeat"): ["--profile", "timeline"], ("bisect", "warmup"): ["--profile", "timeline"],
                 ("capture", "keep_ptx"): ["--window", "nvtx:step"],
                 **{("advise", o): ["--no-what-if"] for o in ("replace", "launch_override", "repeat", "warmup",
                                                             "graphs")}}


def inert_cases() -> Iterator[Case]:
    """Every declared Inert option given where it does nothing: refused naming it (or a
    warning), never accepted silently."""
    for path, cmd in commands():
        rules = getattr(cmd.callback, "cudasnap_inert", ())
        by = {p.name: p for p in cmd.params}
        for r in rules:
            p = by[r.option]
            opt = _value_for(p) + INERT_CONTEXT.get((path[-1], r.option), [])
            case = Case("inert", _tail(path, opt), _long(p), code=(2,) if not r.warn else (0, 1, 2), inert=True)
            yield case
    # contradictory pairs decided in the command itself
    yield Case("inert", ["capture", "--window", "nvtx:x", "--flight-recorder", "5", "--", "true"], "--flight-recorder")
    yield Case("inert", ["replay", "snap.cusnap", "--exact", "--tolerance", "torch"], "--exact")


SELECTIONS = ["x(y", "", " ", ",", "5-2", "99999999-", "nosuchkernel_zz", "launches,5-2", "-", "--"]


def selection_cases() -> Iterator[Case]:
    for v in SELECTIONS:
        for path in (("dump",), ("replay",), ("export",)):
            yield Case("selection", _tail(path, [f"--calls={v}"]), "--calls")
    for opt, v in (("--kernels", "("), ("--kernels", "[a-"), ("-k", ""), ("-k", "regex:"), ("-k", "regex:("),
                   ("--kernel-name", "regex:a{2,1}")):
        yield Case("selection", ["replay", "snap.cusnap", opt, v], opt.lstrip("-")[:6] if opt != "-k" else "kernel-name")
    for v in ("kernel:add_one#-1", "kernel:add_one#0", "kernel:(", "launches:5-2", "time:3-1", "nvtx:", "bogus:1",
              "launches:-1-3", "time:nan-inf"):
        yield Case("selection", ["capture", "--window", v, "--", "true"], "--window")
    for v in ("x#-1", "(", "x#0"):
        yield Case("selection", ["extract", "snap.cusnap", "-o", "ext.cusnap", "--kernel", v], "--kernel")


def path_cases() -> Iterator[Case]:
    inputs = {("info",): 0, ("dump",): 0, ("stats",): 0, ("replay",): 0, ("repair",): 0, ("export",): 0,
              ("extract",): 0, ("advise",): 0, ("bisect",): 0, ("compare",): 0}
    for path in inputs:
        req = REQUIRED[path]
        for bad, names in (("missing.cusnap", "missing.cusnap"), ("adir", "adir"), ("", ""),
                           ("text.txt", "text.txt"), ("empty.sqlite", "empty.sqlite")):
            args = [*path, bad, *req[1:]] if path != ("compare",) else [*path, bad, "prof.json"]
            if path in (("info",), ("dump",), ("stats",), ("replay",), ("repair",)) and bad == "":
                names = ""
            yield Case("path", args, names)
    outs = [(("capture",), ["-o", "nodir/x.cusnap", "--", "true"], "nodir"),
            (("capture",), ["-o", "adir", "--", "true"], "adir"),
            (("capture",), ["-o", "", "--", "true"], "-o"),
            (("capture",), ["-o", "snap.cusnap", "--", "true"], "snap.cusnap"),
            (("repair",), ["snap.cusnap", "-o", "snap.cusnap"], "snap.cusnap"),
            (("repair",), ["snap.cusnap", "-o", "nodir/r.cusnap"], "nodir"),
            (("extract",), ["snap.cusnap", "-o", "snap.cusnap", "--launch", "8"], "snap.cusnap"),
            (("extract",), ["snap.cusnap", "-o", "nodir/e.cusnap", "--launch", "8"], "nodir"),
            (("export",), ["snap.cusnap", "-o", "nodir/sub"], "nodir"),
            (("export",), ["snap.cusnap", "-o", "text.txt"], "text.txt"),
            (("stats",), ["snap.cusnap", "--out", "x.txt"], "--out"),
            (("stats",), ["snap.cusnap", "--out", "snap.cusnap"], "snap.cusnap"),
            (("stats",), ["snap.cusnap", "--out", "nodir/x.sqlite"], "nodir"),
            (("replay",), ["snap.cusnap", "--out", "snap.cusnap"], "snap.cusnap"),
            (("replay",), ["snap.cusnap", "--out", "o.txt"], "--out"),
            (("replay",), ["snap.cusnap", "--out", "nodir/o.json"], "nodir"),
            (("replay",), ["snap.cusnap", "--profile", "timeline", "--trace", "prof.json"], "prof.json"),
            (("compare",), ["prof.json", "prof.json", "--html", "prof.json"], "prof.json"),
            (("advise",), ["snap.cusnap", "--out", "o.txt"], "--out"),
            (("advise",), ["snap.cusnap", "--out", "prof.json"], "prof.json"),
            (("advise",), ["snap.cusnap", "--html", "o.json"], "--html"),
            (("bisect",), ["snap.cusnap", "--envs", "envs.toml", "--keep", "text.txt"], "text.txt"),
            (("bisect",), ["snap.cusnap", "--envs", "missing.toml"], "missing.toml"),
            (("campaign", "run"), ["camp.toml", "-o", "adir"], "adir"),
            (("campaign", "run"), ["camp.toml", "-o", "nodir/s.sqlite"], "nodir"),
            (("campaign", "report"), ["store.sqlite", "--html", "store.sqlite"], "store.sqlite"),
            (("campaign", "report"), ["missing.sqlite"], "missing.sqlite")]
    for path, rest, names in outs:
        yield Case("path", [*path, *rest], names)
    # a good output path with a bad input: the refusal makes no output
    for bad in ("missing.cusnap", "text.txt"):
        for args in (["bisect", bad, "--envs", "envs.toml", "--keep", "keepdir", "--html", "b.html"],
                     ["extract", bad, "-o", "e.cusnap", "--launch", "8"], ["export", bad, "-o", "expdir"],
                     ["stats", bad, "--out", "s.sqlite"], ["stats", bad, "--out", "csvdir/"],
                     ["replay", bad, "--out", "o.json", "--trace", "t.json"], ["repair", bad, "-o", "r.cusnap"],
                     ["advise", bad, "--out", "a.json", "--html", "a.html"], ["compare", bad, "prof.json", "--html", "c.html"],
                     ["capture", "-o", "c.cusnap", "--", f"./{bad}"]):
            yield Case("path", args, bad, code=(126, 127) if args[0] == "capture" else (2,))
    for bad in ("missing.sqlite", "other.sqlite", "empty.sqlite", "text.txt"):
        yield Case("path", ["campaign", "report", bad, "--html", "r.html"], bad)


def filetype_cases() -> Iterator[Case]:
    """A file of the wrong kind where another is expected (each left as it was)."""
    for f in ("other.sqlite", "empty.sqlite", "text.txt", "snap.cusnap", "prof.json", "camp.toml"):
        yield Case("filetype", ["campaign", "report", f], f)
        if f != "empty.sqlite":                  # an empty file may become a store
            yield Case("filetype", ["campaign", "run", "camp.toml", "-o", f], f)
    for f in ("text.txt", "prof.json", "other.sqlite", "camp.toml"):
        for path in (("info",), ("dump",), ("stats",), ("replay",), ("export",)):
            yield Case("filetype", [*path, f, *REQUIRED[path][1:]], f)
    for f in ("snap.cusnap", "text.txt", "other.sqlite", "envs.toml"):
        yield Case("filetype", ["compare", f, "prof.json"], f)
        yield Case("filetype", ["campaign", "run", f], f)
        if f != "envs.toml":
            yield Case("filetype", ["bisect", "snap.cusnap", "--envs", f], f)
        yield Case("filetype", ["stats", "snap.cusnap", "--out", "k.sqlite", "--kernel-metrics", f], f)


TOML_BAD = [
    ("[rules]\nthreshold = nan\n", "threshold"), ("[rules]\nthreshold = inf\n", "threshold"),
    ("[rules]\nthreshold = -inf\n", "threshold"), ("[rules]\nthreshold = 1e309\n", "threshold"),
    ("[rules]\nthreshold = -1\n", "threshold"), ("[rules]\nrepeats = 99999999999\n", "repeats"),
    ("[rules]\nrepeats = 0\n", "repeats"), ("[rules]\nrepeats = 1.5\n", "repeats"),
    ("[rules]\nwarmup = -1\n", "warmup"), ("[rules]\nwarmup = 99999999999\n", "warmup"),
    ("[rules]\ntimeout = nan\n", "timeout"), ("[rules]\ntimeout = 0\n", "timeout"),
    ("[rules]\nnoise_factor = nan\n", "noise_factor"), ("[rules]\nmax_reruns = 99999999999\n", "max_reruns"),
    ("[rules]\nretries = -1\n", "retries"), ("[rules]\nretries = 99999999999\n", "retries"),
    ("[rules]\nconfirm = 3\n", "confirm"), ("[rules]\nbogus = 1\n", "bogus"),
]
ENV_BAD = [('vars = {"A=B" = "1"}', "A=B"), ('vars = {"" = "1"}', "variable"), ('vars = {X = [1]}', "vars"),
           ('driver = "/nonexistent/libcuda.so.1"', "driver"), ('driver = 3', "driver"),
           ('vars = {X = "a\\u0000b"}', "NUL"), ('driver = "/etc/passwd"', "ELF"),
           ('driver = "/dev/zero"', "character device"), ('driver = "/etc"', "without libcuda")]


def file_content_cases() -> Iterator[Case]:
    """Campaign files and bisect ENVS.toml with bad values (written as cases are made)."""
    base = '[[snapshot]]\npath = "snap.cusnap"\n[[env]]\nname = "a"\n[[env]]\nname = "b"\n'
    for i, (extra, names) in enumerate(TOML_BAD):
        yield Case("file", ["campaign", "run", f"bad_camp{i}.toml", "-o", "new.sqlite"], names,
                   env={"_WRITE": f"bad_camp{i}.toml", "_TEXT": base + extra})
    for i, (extra, names) in enumerate(ENV_BAD):
        text = f'[[env]]\nname = "a"\n[[env]]\nname = "b"\n{extra}\n'
        yield Case("file", ["bisect", "snap.cusnap", "--envs", f"bad_env{i}.toml"], names,
                   env={"_WRITE": f"bad_env{i}.toml", "_TEXT": text})
        yield Case("file", ["campaign", "run", f"bad_cenv{i}.toml", "-o", "new.sqlite"], names,
                   env={"_WRITE": f"bad_cenv{i}.toml",
                        "_TEXT": '[[snapshot]]\npath = "snap.cusnap"\n' + text})


def spec_cases() -> Iterator[Case]:
    for v in ("grid=99999999999999999999999,1,1", "grid=0", "grid=-1", "grid=", "block=4294967296",
              "grid=1,4294967296", "kernel=(", "grid=1,1,1,1", "bogus=1", "grid=x", "block=1e3"):
        yield Case("spec", ["replay", "snap.cusnap", "--launch-override", v], "--launch-override")
        yield Case("spec", ["advise", "snap.cusnap", "--launch-override", v], "--launch-override")
    for v in ("add_one=adir", "add_one=missing.cubin", "add_one", "=x", "add_one="):
        yield Case("spec", ["replay", "snap.cusnap", "--replace", v], "--replace")
        yield Case("spec", ["advise", "snap.cusnap", "--replace", v], "--replace")
    for v in ("garbage", "a=adir", "a=missing.cubin;b"):
        yield Case("spec", ["replay", "snap.cusnap"], "CUDASNAP_REPLACE", env={"CUDASNAP_REPLACE": v})
    for v in ("x", "2026-13-01", "yesterday"):
        yield Case("spec", ["campaign", "report", "store.sqlite", "--since", v], "--since")
    for v in ("--bogus", "nvcc -x"):
        yield Case("spec", ["replay", "snap.cusnap", "--jit", v], "--jit")
    for v in ("1,x", "-1", "a"):
        yield Case("spec", ["replay", "snap.cusnap", "--devices", v], "--devices")


def program_cases() -> Iterator[Case]:
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "adir"], "adir", code=(126,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "./adir"], "adir", code=(126,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "./prog.sh"], "prog.sh", code=(126,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "./noshebang"], "noshebang", code=(126,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "./text.txt"], "text.txt", code=(126,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", "no-such-program-zz"], "no-such-program-zz",
               code=(127,))
    yield Case("program", ["capture", "-o", "c.cusnap", "--", ""], "", code=(2, 127))


# ------------------------------------------------------------------ faults beyond pipes (issue 60)

SPECIAL = [("fifo", "FIFO"), ("/dev/zero", "/dev/zero"), ("/dev/null", "/dev/null"), ("/dev/urandom", "/dev/urandom"),
           ("/proc/self/status", "/proc/self/status"), ("/proc/self/maps", "/proc/self/maps"),
           ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/"), ("/dev/full", "/dev/full"),
           ("/proc/self/cmdline", "/proc/self/cmdline"), ("/proc/uptime", "/proc/uptime"),
           ("/proc/self/environ", "/proc/self/environ"), ("sock", "socket")]


def input_slots() -> Iterator[Tuple[str, List[str]]]:
    """Every place a command reads a file, as (what, args with IN where the file goes)."""
    for path in (("info",), ("dump",), ("stats",), ("replay",), ("repair",), ("export",), ("extract",), ("advise",)):
        yield f"{' '.join(path)} SNAPSHOT", [*path, "IN", *REQUIRED[path][1:]]
    yield "info --json", ["info", "IN", "--json"]
    yield "dump --format jsonl", ["dump", "IN", "--format", "jsonl"]
    yield "stats --out", ["stats", "IN", "--out", "s.sqlite"]
    yield "replay --sim", ["replay", "IN", "--sim", "gpgpu-sim"]
    yield "bisect SNAPSHOT", ["bisect", "IN", "--envs", "envs.toml"]
    yield "bisect --envs", ["bisect", "snap.cusnap", "--envs", "IN"]
    yield "compare BASE", ["compare", "IN", "prof.json"]
    yield "compare CAND", ["compare", "prof.json", "IN"]
    yield "advise PROFILE", ["advise", "IN", "--no-what-if"]
    yield "advise --metrics", ["advise", "prof.json", "--metrics", "IN"]
    yield "stats --kernel-metrics", ["stats", "snap.cusnap", "--out", "k.sqlite", "--kernel-metrics", "IN"]
    yield "replay --replace", ["replay", "snap.cusnap", "--replace", "add_one=IN"]
    yield "advise --replace", ["advise", "snap.cusnap", "--replace", "add_one=IN"]
    yield "campaign run", ["campaign", "run", "IN", "-o", "new.sqlite"]
    yield "campaign report", ["campaign", "report", "IN"]


def special_cases() -> Iterator[Case]:
    """Every input of every command given a FIFO, a device, a kernel file: refused by type
    before reading (a FIFO would block, /dev/zero never ends)."""
    for _, tpl in input_slots():
        for f, names in SPECIAL:
            args = [a.replace("IN", f) for a in tpl]
            yield Case("special", args, names if names != "FIFO" else "FIFO")
    for f, names in SPECIAL[:3]:        # a snapshot named in a campaign file
        yield Case("special", ["campaign", "run", f"sp_camp_{names.strip('/').replace('/', '_')}.toml", "-o", "n.sqlite"],
                   names, env={"_WRITE": f"sp_camp_{names.strip('/').replace('/', '_')}.toml",
                               "_TEXT": f'[[snapshot]]\npath = "{f}"\n[[env]]\nname = "a"\n'})


def identity_cases() -> Iterator[Case]:
    """An output that is an input by another name (a symbolic or hard link), or a directory
    output that holds an input (directly or through a link): refused, -f or not."""
    for out in ("lnk.cusnap", "hard.cusnap"):
        yield Case("identity", ["repair", "snap.cusnap", "-o", out, "-f"], out)
        yield Case("identity", ["extract", "snap.cusnap", "-o", out, "--launch", "8", "-f"], out)
        yield Case("identity", ["stats", "snap.cusnap", "--out", out, "-f"], out)
        yield Case("identity", ["replay", "snap.cusnap", "--out", out, "-f"], out)
        yield Case("identity", ["replay", "snap.cusnap", "--profile", "timeline", "--trace", out, "-f"], out)
        yield Case("identity", ["repair", out, "-o", "snap.cusnap", "-f"], "snap.cusnap")
    for out in ("lnkprof.json", "hardprof.json"):
        yield Case("identity", ["compare", "prof.json", "prof.json", "--html", out, "-f"], out)
        yield Case("identity", ["advise", "prof.json", "--out", out, "-f"], out)
    yield Case("identity", ["campaign", "report", "store.sqlite", "--html", "hardstore.sqlite", "-f"], "hardstore.sqlite")
    yield Case("identity", ["campaign", "run", "camp.toml", "-o", "camp.toml"], "camp.toml")
    for d in (".", "linkdir", "./", "linkdir/"):
        yield Case("identity", ["export", "snap.cusnap", "-o", d, "-f"], "snap.cusnap")
        yield Case("identity", ["export", "lnk.cusnap", "-o", d, "-f"], "lnk.cusnap")
        yield Case("identity", ["stats", "snap.cusnap", "--out", d if d.endswith("/") else d + "/", "-f"], "snap.cusnap")
        yield Case("identity", ["bisect", "snap.cusnap", "--envs", "envs.toml", "--keep", d, "-f"], "holds the input")


FILE_OUTPUTS = [(["repair", "snap.cusnap", "-o", "OUT.cusnap"], ".cusnap"),
                (["extract", "snap.cusnap", "-o", "OUT.cusnap", "--launch", "8"], ".cusnap"),
                (["stats", "snap.cusnap", "--out", "OUT.sqlite"], ".sqlite"),
                (["replay", "snap.cusnap", "--out", "OUT.json"], ".json"),
                (["replay", "snap.cusnap", "--profile", "timeline", "--trace", "OUT.json"], ".json"),
                (["compare", "prof.json", "prof.json", "--html", "OUT.html"], ".html"),
                (["advise", "prof.json", "--out", "OUT.json"], ".json"),
                (["bisect", "snap.cusnap", "--envs", "envs.toml", "--html", "OUT.html"], ".html"),
                (["campaign", "report", "store.sqlite", "--html", "OUT.html"], ".html"),
                (["campaign", "run", "camp.toml", "-o", "OUT.sqlite"], ".sqlite")]


def longname_cases() -> Iterator[Case]:
    """Output names past what the temporary files beside them allow, refused before any work
    (never "File name too long" after it); names at the limit pass that check."""
    from cudasnap.formats.outputs import TMP_EXTRA
    limit = 255 - TMP_EXTRA
    for tpl, ext in FILE_OUTPUTS:
        for n in (limit + 1, limit + 5, 236, 241, 250, 255, 256, 260, 400, 512, 1024, 4096):
            if n <= limit:
                continue
            name = "n" * (n - len(ext)) + ext
            yield Case("longname", [a.replace("OUT" + ext, name) for a in tpl], "too long")
        deep = "/".join(["d" * 200] * 21) + "/x" + ext                # past PATH_MAX
        yield Case("longname", [a.replace("OUT" + ext, deep) for a in tpl], "")
    for n in (limit, limit - 1):                                     # at the limit: written
        name = "m" * (n - len(".sqlite")) + ".sqlite"
        yield Case("longname", ["stats", "snap.cusnap", "--out", name], "", code=(0,))


WINDOW_ENV_BAD = [{"CUDASNAP_WINDOW": v} for v in ("bogus", "", "launches:1-2", "time", "kernel", "nvtx", "signal:x")] + [
    {"CUDASNAP_WINDOW": "launches", "CUDASNAP_WIN_A": a, "CUDASNAP_WIN_B": b}
    for a, b in (("5", "2"), ("x", "3"), ("-1", "3"), ("1", "y"), ("99999999999999999999999", "1"))] + [
    {"CUDASNAP_WINDOW": m, "CUDASNAP_WIN_NAME": n, "CUDASNAP_WIN_K": k}
    for m in ("kernel", "nvtx") for n, k in (("", "1"), ("x", "0"), ("x", "-1"), ("x", "y"))] + [
    {"CUDASNAP_WINDOW": "kernel", "CUDASNAP_WIN_NAME": "(", "CUDASNAP_WIN_K": "1"},
    {"CUDASNAP_WINDOW": "kernel", "CUDASNAP_WIN_NAME": "x", "CUDASNAP_WIN_K": "1", "CUDASNAP_WIN_CONTEXT": "z"}]


def environment_cases() -> Iterator[Case]:
    """CUDASNAP_WINDOW and its values that are not a window: refused naming the variable before
    the program runs (they would change the capture without a word)."""
    for env in WINDOW_ENV_BAD:
        for prog in (["true"], ["sh", "-c", "exit 3"]):
            yield Case("environment", ["capture", "-o", "c.cusnap", "--", *prog], "CUDASNAP_WINDOW", env=dict(env),
                       code=(2,))


def deep(n: int, kind: str = "list") -> str:
    return ("[" * n + "]" * n) if kind == "list" else ('{"a":' * n + "1" + "}" * n)


def small_cases() -> Iterator[Case]:
    """The smaller items of issue 60: a record schema newer than known, JSON nested past any
    reader, --profile timeline with --sim where no timeline is made."""
    for path in (("info",), ("dump",), ("stats",), ("replay",), ("repair",), ("export",), ("extract",), ("advise",)):
        yield Case("small", [*path, "future.cusnap", *REQUIRED[path][1:]], "schema 99")
    for n in (1000, 100_000):
        for kind in ("list", "dict"):
            f = f"deep_{kind}_{n}.json"
            yield Case("small", ["compare", f, "prof.json"], f, env={"_WRITE": f, "_TEXT": deep(n, kind)})
            yield Case("small", ["compare", "prof.json", f], f, env={"_WRITE": f, "_TEXT": deep(n, kind)})
            yield Case("small", ["advise", f], f, env={"_WRITE": f, "_TEXT": deep(n, kind)})
    for mode in ("functional", "performance"):
        yield Case("small", ["replay", "snap.cusnap", "--sim", "gpgpu-sim", "--sim-mode", mode, "--profile",
                             "timeline"], "--profile timeline")


CLASSES = {"number": numeric_cases, "inert": inert_cases, "selection": selection_cases, "path": path_cases,
           "filetype": filetype_cases, "file": file_content_cases, "spec": spec_cases, "program": program_cases,
           "special": special_cases, "identity": identity_cases, "longname": longname_cases,
           "environment": environment_cases, "small": small_cases}


def all_cases() -> Dict[str, List[Case]]:
    return {k: list(f()) for k, f in CLASSES.items()}


# ------------------------------------------------------------------ running

@dataclass
class Outcome:
    case: Case
    code: int
    stderr: str
    problems: List[str]


def run_case(work: Path, case: Case) -> Outcome:
    env = {k: v for k, v in case.env.items() if not k.startswith("_")}
    if "_WRITE" in case.env:
        p = work / case.env["_WRITE"]
        p.write_text(case.env["_TEXT"])
        os.utime(p, (1_600_000_000, 1_600_000_000))
    before = state(work)
    with cwd(work):
        res = runner.invoke(app, case.args, env=env or None, catch_exceptions=True)
    after = state(work)
    try:
        err = res.stderr or ""
    except ValueError:               # an older click mixes stderr into output
        err = res.output or ""
    out = res.output or ""
    problems = []
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        problems.append("traceback: " + "".join(traceback.format_exception_only(type(res.exception),
                                                                                 res.exception)).strip())
    if "Traceback" in out + err:
        problems.append("traceback in output")
    code = res.exit_code
    if code not in case.code:
        problems.append(f"exit {code}, want {'/'.join(map(str, case.code))}")
    changed = [k for k in before if k in after and before[k] != after[k]]
    gone = [k for k in before if k not in after]
    if changed or gone:
        problems.append(f"inputs changed: {', '.join(changed + gone)}")
    new = [k for k in after if k not in before]
    if new and code != 0:
        problems.append(f"output created on refusal: {', '.join(new)}")
        _remove(work, new)
    elif new:
        _remove(work, new)
    if code == 2 and case.names and case.names.lower() not in err.lower():
        problems.append(f"the message does not name {case.names!r}")
    if case.inert and code == 0 and case.names not in err:
        problems.append("inert option accepted silently")
    return Outcome(case, code, err, problems)


def _remove(work: Path, names: List[str]) -> None:
    import shutil
    for n in sorted(names, key=len, reverse=True):
        p = work / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                pass


def tally(outcomes: List[Outcome]) -> Dict[str, int]:
    def n(prefix):
        return sum(1 for o in outcomes if any(p.startswith(prefix) for p in o.problems))
    return {"cases": len(outcomes), "tracebacks": n("traceback"), "inputs changed": n("inputs changed"),
            "outputs on refusal": n("output created"), "wrong exit codes": n("exit "),
            "messages not naming it": n("the message"), "inert accepted silently": n("inert option")}


def summary_line(t: Dict[str, int]) -> str:
    return (f"{t['cases']} bad inputs: {t['tracebacks']} tracebacks, {t['inputs changed']} inputs changed, "
            f"{t['wrong exit codes']} wrong exit codes, {t['inert accepted silently']} inert options accepted "
            f"silently, {t['outputs on refusal']} outputs on refusal, {t['messages not naming it']} messages "
            f"not naming it")
