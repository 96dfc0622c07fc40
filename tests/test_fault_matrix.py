"""Fault-injection matrix: every command keeps its promises on damaged input and hostile disks.

A small program is captured on the test double; seeded faults are then applied to the
snapshot (bit flips, truncation, zeroed stretches, garbage), to output paths (missing,
unwritable, a directory), to the disk (a file-size limit, writes failing with ENOSPC) and to
the program (SIGKILL at random points). For every case: no traceback; the exit code the
rules give (info/dump: 0 when every record reads, else 2; repair: 0 when the file has a
snapshot's start, else 2; replay: 2 when unreadable, damaged or without a call to replay,
0 when what a read finds replays and verifies; capture: 2 when the snapshot cannot be
written, the program's own status otherwise); one line on stderr for every exit 2; and no
records lost: "records lost" counts records a plain read of the damaged file finds that
repair did not keep, and calls missing before the last recorded one of a killed program.
File faults run in-process; a few subprocesses capture, kill, fill the disk and replay.
The output matrix puts every command's outputs on hostile paths among precious files: no
traceback, the exit code, no file lost or half-written, no temporary file left.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from typer.testing import CliRunner

from cudasnap.cli import app
from cudasnap.formats import SnapshotError, SnapshotReader, SnapshotWriter
from cudasnap.replay.dispatch import is_query

SEED = 1212
FILE_CASES = {"flip": 45, "truncate": 25, "zero": 12, "tail_garbage": 8}   # per base snapshot
GARBAGE_CASES = 16
DRIVER_REPLAYS = 40           # damaged-but-readable snapshots replayed on the double
KILLS = 4

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:                    # click >= 8.2 always separates stderr
    runner = CliRunner()

# Replays snapshots on the double, each in a forked child (fresh driver state), and prints
# {path: [exit code, stdout + stderr]}: one interpreter start for the whole batch.
WORKER = r"""
import json, os, signal, sys, traceback
from cudasnap.replay import ReplayOptions, run_replay_cli
out = {}
for path in json.loads(sys.stdin.read()):
    log = path + ".replay.log"
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        try:
            code = run_replay_cli(path, ReplayOptions())
        except BaseException:
            traceback.print_exc()
            code = 99
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    out[path] = [os.waitstatus_to_exitcode(status), open(log, errors="replace").read()]
print(json.dumps(out))
"""

# Runs the CLI with RLIMIT_FSIZE lowered for cudasnap itself (the program it runs gets the
# limit back: its ring, a file in /dev/shm, must not hit it): the disk "fills" at that size.
FULL_DISK = r"""
import resource, sys
import cudasnap.capture.runner as runner
limit = int(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
spawn = runner._spawn_gated
def unlimited_spawn(*a, **kw):      # the program starts without the limit; only capture's writes fail
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    try:
        return spawn(*a, **kw)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
runner._spawn_gated = unlimited_spawn
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
from cudasnap.cli import main
sys.argv = ["cudasnap"] + sys.argv[2:]
main()
"""


class Tally:
    def __init__(self):
        self.cases = self.lost = self.tracebacks = self.wrong = 0
        self.problems: list[str] = []

    def problem(self, case: str, what: str) -> None:
        if len(self.problems) < 30:
            self.problems.append(f"{case}: {what}")

    def traceback(self, case: str, text: str) -> None:
        self.tracebacks += 1
        self.problem(case, f"traceback: {text[-400:]}")

    def exit(self, case: str, cmd: str, got: int, want: int, stderr: str, output: str = "") -> None:
        if got != want:
            self.wrong += 1
            self.problem(case, f"{cmd} exited {got}, want {want}: {(stderr or output).strip()[-300:]}")
        elif got == 2:
            err = stderr.strip()
            if "\n" in err or not err.startswith("cudasnap: error: "):
                self.problem(case, f"{cmd}: exit 2 without one error line on stderr: {err[-300:]!r}")


def _stderr(res) -> str:
    try:
        return res.stderr
    except (ValueError, AttributeError):
        return ""


def cli(t: Tally, case: str, *args: str):
    """Run a command in-process; (exit code, stdout, stderr); an exception is a traceback."""
    res = runner.invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        t.traceback(case, f"{args[0]}: " + "".join(traceback.format_exception(res.exception)))
    return res.exit_code, res.stdout, _stderr(res)


def plain_read(path: Path) -> dict:
    """What a plain read finds: whether the file opens, the records it yields before any error,
    whether all of them (and the frame sizes info shows) read, whether every frame verifies,
    and whether a call to replay is among them."""
    got = {"opens": False, "records": 0, "records_ok": False, "stats_ok": False, "verifies": False,
           "has_call": False}
    try:
        r = SnapshotReader(path)
    except SnapshotError:
        return got
    got["opens"] = True
    with r:
        try:
            for rec in r.records():
                got["records"] += 1
                f = rec.get("f")
                if rec.get("k") == "c" and isinstance(f, str) and "r" in rec and not rec.get("incomplete") \
                        and not is_query(f):
                    got["has_call"] = True
            got["records_ok"] = True
            r.stats
            got["stats_ok"] = True
            r.verify()
            got["verifies"] = True
        except SnapshotError:
            pass
    return got


def _kept(path: Path) -> int:
    with SnapshotReader(path) as r:
        return sum(1 for rec in r.records() if rec.get("k") != "repair")


def _rewrite(src: Path, dst: Path, close: bool) -> None:
    """The captured records in small frames (a file of many frames), with or without an index."""
    r = SnapshotReader(src)
    w = SnapshotWriter(dst, dict(r.raw_header), frame_bytes=256)
    for rec in r.records():
        if rec.get("k") == "b":
            continue                        # blobs are added again below, before their records
        for ref in (rec.get("x") or {}).values():
            if isinstance(ref, dict) and isinstance(ref.get("blob"), str):
                ref["blob"] = w.add_blob(r.blob(ref["blob"]))
        w.write(rec)
    if close:
        w.close()
    else:
        w.abort()


def _mutations(data: bytes, rnd: random.Random):
    n = len(data)
    for i in range(FILE_CASES["flip"]):
        d = bytearray(data)
        for _ in range(rnd.randint(1, 4)):
            d[rnd.randrange(n)] ^= 1 << rnd.randrange(8)
        yield f"flip{i}", bytes(d)
    for i in range(FILE_CASES["truncate"]):
        yield f"truncate{i}", data[:rnd.randrange(n)]
    for i in range(FILE_CASES["zero"]):
        at = rnd.randrange(n)
        k = rnd.randint(1, 96)
        yield f"zero{i}", data[:at] + bytes(min(k, n - at)) + data[at + k:]
    for i in range(FILE_CASES["tail_garbage"]):
        yield f"tail_garbage{i}", data[:rnd.randrange(n)] + rnd.randbytes(rnd.randint(1, 3000))


def check_file_case(t: Tally, case: str, p: Path, work: Path, driver_batch: list, inplace: bool) -> None:
    t.cases += 1
    want = plain_read(p)
    readable = want["records_ok"] and want["stats_ok"]
    code, out, err = cli(t, case, "info", str(p))
    t.exit(case, "info", code, 0 if readable else 2, err, out)
    if code == 0 and "None" in out:
        t.problem(case, "info printed a Python None")
    code, out, err = cli(t, case, "dump", str(p))
    t.exit(case, "dump", code, 0 if want["records_ok"] else 2, err, out)

    fixed = work / f"{case}.fixed.cusnap"
    mode = stat.S_IMODE(p.stat().st_mode)
    code, out, err = cli(t, case, "repair", str(p), "-o", str(fixed))
    t.exit(case, "repair", code, 0 if want["opens"] else 2, err, out)
    if code == 0:
        if "intact, nothing to do" in out:
            kept = want["records"]
            if fixed.exists() or not want["verifies"]:
                t.problem(case, "repair called a damaged file intact, or wrote it anyway")
        else:
            kept = _kept(fixed)
            with SnapshotReader(fixed) as r:
                indexed = not r.truncated
            if not indexed or stat.S_IMODE(fixed.stat().st_mode) != mode:
                t.problem(case, "repaired file without an index or with another mode")
            info = cli(t, case, "info", str(fixed))
            if info[0] != 0 or (kept < want["records"] and "repaired : PARTIAL" not in info[1]):
                t.problem(case, f"info of the repaired file hides the loss: {info[1][:300]}")
        if kept < want["records"]:
            t.lost += want["records"] - kept
            t.problem(case, f"repair kept {kept} records, a plain read finds {want['records']}")
    if inplace and want["opens"]:
        check_in_place(t, case, p, work)

    if not (want["records_ok"] and want["has_call"]):
        code, out, err = cli(t, case, "replay", str(p))        # refused before any driver work
        t.exit(case, "replay", code, 2, err, out)
    else:
        driver_batch.append((case, p, 0 if want["verifies"] else 2))


def check_in_place(t: Tally, case: str, p: Path, work: Path) -> None:
    q = work / f"{case}.inplace.cusnap"
    before = p.read_bytes()
    q.write_bytes(before)
    q.chmod(0o640)
    code, out, err = cli(t, case, "repair", str(q))
    orig = Path(f"{q}.orig")
    if code != 0:
        t.exit(case, "repair in place", code, 0, err, out)
    elif "intact" in out:
        if orig.exists() or q.read_bytes() != before:
            t.problem(case, "in-place repair touched an intact file")
    elif not orig.exists() or orig.read_bytes() != before or stat.S_IMODE(q.stat().st_mode) != 0o640:
        t.problem(case, "in-place repair lost the original or the file mode")


def check_output_paths(t: Tally, work: Path, damaged: Path) -> None:
    """Unwritable outputs: capture refuses before running the program; repair says so."""
    from cudasnap.capture.runner import run_capture
    (work / "a_file").write_text("")
    marker = work / "program_ran"
    for name, out in (("missing_dir", work / "nope" / "x.cusnap"), ("a_dir", work),
                      ("under_a_file", work / "a_file" / "x.cusnap"), ("unwritable_dir", Path("/sys/x.cusnap"))):
        case = f"capture_to_{name}"
        t.cases += 1
        err = StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(StringIO()):
                code = run_capture(["touch", str(marker)], out, ring_mb=1)
        except Exception as e:      # noqa: BLE001 - counted, not raised
            t.traceback(case, repr(e))
            continue
        t.exit(case, "capture", code, 2, err.getvalue())
        if marker.exists():
            t.problem(case, "the program ran although its snapshot could not be written")
        t.cases += 1
        code, out_, err_ = cli(t, f"repair_to_{name}", "repair", str(damaged), "-o", str(out))
        t.exit(f"repair_to_{name}", "repair", code, 2, err_, out_)


def check_repair_on_full_disk(t: Tally, work: Path, damaged: Path, monkeypatch) -> None:
    """Writes failing with ENOSPC midway: exit 2, one line, the source untouched, nothing left."""
    from cudasnap.formats import recover
    real = recover._rewrite
    work = work / "full_disk"
    work.mkdir()
    damaged = Path(shutil.copy(damaged, work))

    def full(r, segs, f, note):
        f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    before = damaged.read_bytes()
    monkeypatch.setattr(recover, "_rewrite", full)
    try:
        for name, extra in (("in_place", []), ("to_file", ["-o", str(work / "full.cusnap")])):
            case = f"repair_full_disk_{name}"
            t.cases += 1
            code, out, err = cli(t, case, "repair", str(damaged), *extra)
            t.exit(case, "repair", code, 2, err, out)
            left = [x.name for x in work.iterdir() if x.name.startswith(".cusnap-repair") or x.name.endswith(".orig")
                    or x.name == "full.cusnap"]
            if damaged.read_bytes() != before or left:
                t.problem(case, f"a failed repair changed the source or left {left}")
    finally:
        monkeypatch.setattr(recover, "_rewrite", real)


def _cudasnap(*args: str) -> list:
    return [sys.executable, "-m", "cudasnap", *args]


def check_capture_on_full_disk(t: Tally, double, work: Path) -> None:
    """The disk fills while capturing: the program runs unchanged, capture then exits 2 (the
    program succeeded, its snapshot was not saved) with the error as its last line."""
    for limit in (2000, 6000):
        case = f"capture_full_disk_{limit}"
        t.cases += 1
        out = work / f"{case}.cusnap"
        cp = subprocess.run([sys.executable, "-c", FULL_DISK, str(limit), "capture", "-o", str(out),
                             "--ring-mb", "16", "--segments", "0", "--", double["progs"]["direct"], "5"],
                            env=double["env"], capture_output=True, text=True, timeout=120)
        if "Traceback" in cp.stderr + cp.stdout:
            t.traceback(case, cp.stderr)
        if "LAUNCHES 5" not in cp.stdout:
            t.problem(case, "the program's output changed")
        t.exit(case, "capture", cp.returncode, 2, cp.stderr.strip().splitlines()[-1] if cp.stderr.strip() else "")
        got = plain_read(out)
        if got["opens"]:             # what reached the disk still repairs to at least a read
            fixed = work / f"{case}.fixed.cusnap"
            code, o, e = cli(t, case, "repair", str(out), "-o", str(fixed))
            kept = got["records"] if "intact" in o else (_kept(fixed) if code == 0 else 0)
            if kept < got["records"]:
                t.lost += got["records"] - kept


def check_killed_programs(t: Tally, double, work: Path, rnd: random.Random, driver_batch: list) -> None:
    """SIGKILL at random points: capture dies of the same signal, the snapshot is closed and holds
    every call up to the last one recorded (sequence numbers without a hole)."""
    killme = double["progs"]["killme"]
    for i in range(KILLS):
        case = f"sigkill{i}"
        t.cases += 1
        out = work / f"{case}.cusnap"
        if i % 2 == 0:              # the program kills itself after M launches
            m = rnd.randint(1, 400)
            cp = subprocess.run(_cudasnap("capture", "-o", str(out), "--ring-mb", "16", "--", killme, str(m)),
                                env=double["env"], capture_output=True, text=True, timeout=120)
            code, stderr = cp.returncode, cp.stderr
        else:                       # someone else kills it while it launches
            m = 0
            p = subprocess.Popen(_cudasnap("capture", "-o", str(out), "--ring-mb", "16", "--", killme),
                                 env=double["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            p.stdout.readline()
            time.sleep(rnd.uniform(0.02, 0.4))
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            for k in kids:
                os.kill(int(k), signal.SIGKILL)
            stdout, stderr = p.communicate(timeout=120)
            code = p.returncode
        if "Traceback" in stderr:
            t.traceback(case, stderr)
        if code not in (-9, 137):
            t.wrong += 1
            t.problem(case, f"capture exited {code}, want death by SIGKILL")
        try:
            with SnapshotReader(out) as r:
                seqs = sorted(rec["s"] for rec in r.records("c"))
                if r.truncated:
                    t.problem(case, "the recorder did not close the snapshot of a killed program")
        except SnapshotError as e:
            t.problem(case, f"unreadable: {e}")
            continue
        holes = len(set(range(seqs[0], seqs[-1] + 1)) - set(seqs)) if seqs else 0
        t.lost += holes
        if len(seqs) < m:
            t.lost += m - len(seqs)
        driver_batch.append((case, out, 0))


def run_driver_replays(t: Tally, double, batch: list) -> None:
    if not batch:
        return
    cp = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps([str(p) for _, p, _ in batch]),
                        env=double["env"], capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        t.traceback("replay worker", cp.stderr)
        return
    results = json.loads(cp.stdout.strip().splitlines()[-1])
    for case, p, want in batch:
        code, log = results[str(p)]
        if "Traceback" in log:
            t.traceback(case, log)
        if code != want:
            t.wrong += 1
            t.problem(case, f"replay exited {code}, want {want}: {log.strip()[-300:]}")


def test_fault_matrix(double, tmp_path_factory, monkeypatch, record_property):
    work = tmp_path_factory.mktemp("faults")
    rnd = random.Random(SEED)
    t = Tally()

    captured = work / "captured.cusnap"
    cp = subprocess.run(_cudasnap("capture", "-q", "-o", str(captured), "--ring-mb", "16", "--",
                                  double["progs"]["direct"], "5"),
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and "LAUNCHES 5" in cp.stdout, cp.stderr
    bases = {"captured": captured, "framed": work / "framed.cusnap", "unindexed": work / "unindexed.cusnap"}
    _rewrite(captured, bases["framed"], close=True)
    _rewrite(captured, bases["unindexed"], close=False)

    driver_batch: list = []
    n = 0
    for base, path in bases.items():
        data = path.read_bytes()
        for name, blob in _mutations(data, rnd):
            case = f"{base}.{name}"
            p = work / f"{case}.cusnap"
            p.write_bytes(blob)
            p.chmod(0o644)
            n += 1
            check_file_case(t, case, p, work, driver_batch, inplace=n % 12 == 0)
    for i in range(GARBAGE_CASES):
        case = f"garbage{i}"
        p = work / f"{case}.cusnap"
        head = bases["captured"].read_bytes()[:16] if i % 2 else b""     # half start like a snapshot
        p.write_bytes(head + rnd.randbytes(rnd.randint(0, 4000)))
        check_file_case(t, case, p, work, driver_batch, inplace=False)

    damaged = work / "damaged.cusnap"
    data = bytearray(bases["framed"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    check_output_paths(t, work, damaged)
    check_repair_on_full_disk(t, work, damaged, monkeypatch)
    check_capture_on_full_disk(t, double, work)
    check_killed_programs(t, double, work, rnd, driver_batch)

    killed = [b for b in driver_batch if b[0].startswith("sigkill")]
    damaged_ones = [b for b in driver_batch if not b[0].startswith("sigkill")]
    rnd.shuffle(damaged_ones)
    run_driver_replays(t, double, damaged_ones[:DRIVER_REPLAYS] + killed)

    record_property("ci_summary", f"fault matrix: cases {t.cases}, records lost {t.lost}, "
                                  f"tracebacks {t.tracebacks}, wrong exit codes {t.wrong}")
    assert t.cases >= 300
    assert t.tracebacks == 0 and t.wrong == 0 and t.lost == 0 and not t.problems, "\n".join(t.problems)


# ------------------------------------------------------------------ every command's output paths
# (command, its arguments around the output, kind): OUT stands for the output, IN for its input.
FILE_OUTPUTS = {
    "extract -o": (["extract", "IN", "--kernel", ".", "-o", "OUT"], ".cusnap"),
    "repair -o": (["repair", "IN", "-o", "OUT"], ".cusnap"),
    "replay --out": (["replay", "IN", "--profile", "timeline", "--out", "OUT"], ".json"),
    "replay --trace": (["replay", "IN", "--profile", "timeline", "--trace", "OUT"], ".json"),
    "compare --html": (["compare", "IN", "PROFILE", "--html", "OUT"], ".html"),
    "bisect --html": (["bisect", "SNAP", "--envs", "IN", "--html", "OUT"], ".html"),
    "stats --out": (["stats", "IN", "--out", "OUT"], ".sqlite"),
}
DIR_OUTPUTS = {
    "export -o": ["export", "IN", "-o", "OUT"],
    "bisect --keep": ["bisect", "SNAP", "--envs", "IN", "--keep", "OUT"],
    "stats --out DIR/": ["stats", "IN", "--out", "OUT/"],
}


class Outputs:
    """Runs one command per case in a sandbox of precious files: counts files lost (a file
    that existed before and changed or vanished, other than the one replaced with -f), files
    written by a refused command, and temporary files left behind."""

    def __init__(self, t: Tally, box: Path, double):
        self.t, self.box, self.double = t, box, double
        self.tmp_left = 0

    def tree(self) -> dict:
        import hashlib
        return {str(p.relative_to(self.box)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in self.box.rglob("*") if p.is_file()}

    def run(self, case: str, args: list, want: int, replaced=(), name=None, subprocess_=False) -> None:
        t = self.t
        t.cases += 1
        before = self.tree()
        if subprocess_:             # needs the driver: the double, in a process of its own
            cp = subprocess.run(_cudasnap(*args), env=self.double["env"], capture_output=True, text=True, timeout=120)
            code, out, err = cp.returncode, cp.stdout, cp.stderr
            if "Traceback" in out + err:
                t.traceback(case, err)
        else:
            code, out, err = cli(t, case, *args)
        t.exit(case, " ".join(args[:1]), code, want, err, out)
        if want == 2 and name and code == 2 and str(name) not in err:
            t.problem(case, f"the error does not name {name}: {err.strip()}")
        after = self.tree()
        for p, h in before.items():
            if p not in replaced and after.get(p) != h:
                t.lost += 1
                t.problem(case, f"{p} {'changed' if p in after else 'was lost'}")
        new = set(after) - set(before)
        left = [p for p in new if p.endswith(".tmp") or ".cudasnap-probe-" in p]
        if left:
            self.tmp_left += len(left)
            t.problem(case, f"temporary files left: {left}")
        if code == 2 and new - set(left):
            t.problem(case, f"refused, yet wrote {sorted(new)[:3]}")


def _sandbox(box: Path, snap: Path, damaged: Path, profile: Path) -> dict:
    box.mkdir()
    p = {"snap": Path(shutil.copy(snap, box / "in.cusnap")), "damaged": Path(shutil.copy(damaged, box / "bad.cusnap")),
         "profile": Path(shutil.copy(profile, box / "base.json")), "profile2": Path(shutil.copy(profile, box / "cand.json")),
         "envs": box / "envs.toml", "adir": box / "adir", "full": box / "full"}
    p["envs"].write_text('[[env]]\nname = "a"\n[[env]]\nname = "b"\n')
    p["adir"].mkdir()
    (p["adir"] / "inside.txt").write_text("precious")
    p["full"].mkdir()
    (p["full"] / "keep.txt").write_text("not export's")
    (p["full"] / "Makefile").write_text("an older export's")
    for ext in (".cusnap", ".json", ".html", ".sqlite"):
        (box / f"existing{ext}").write_text("precious")
    return p


def _args(tpl: list, p: dict, inp, out) -> list:
    sub = {"IN": str(inp), "SNAP": str(p["snap"]), "PROFILE": str(p["profile2"]), "OUT": str(out),
           "OUT/": f"{out}/"}
    return [sub.get(a, a) for a in tpl]


def check_command_outputs(t: Tally, o: Outputs, p: dict) -> None:
    box = o.box
    inputs = {"extract -o": p["snap"], "repair -o": p["damaged"], "compare --html": p["profile"],
              "bisect --html": p["envs"], "bisect --keep": p["envs"]}
    for cmd, (tpl, ext) in FILE_OUTPUTS.items():
        inp = inputs.get(cmd, p["snap"])
        for case, out, force in (("existing", box / f"existing{ext}", []), ("the_input", inp, ["-f"]),
                                 ("missing_parent", box / "nope" / f"x{ext}", ["-f"]), ("a_directory", p["adir"], ["-f"]),
                                 ("under_a_file", box / f"existing{ext}" / f"x{ext}", ["-f"]),
                                 ("unwritable", Path(f"/proc/cudasnap-x{ext}"), ["-f"])):
            if cmd == "stats --out" and case == "a_directory":
                continue            # stats --out DIR writes CSV tables there: a case of DIR_OUTPUTS
            o.run(f"{cmd} {case}", _args(tpl, p, inp, out) + force, 2, name=out)
    for cmd, tpl in DIR_OUTPUTS.items():
        inp = inputs.get(cmd, p["snap"])
        for case, out, force in (("not_empty", p["full"], []), ("a_file", box / "existing.json", ["-f"]),
                                 ("the_input", inp, ["-f"]), ("missing_parent", box / "nope" / "d", ["-f"]),
                                 ("unwritable", Path("/proc/cudasnap-d"), ["-f"])):
            o.run(f"{cmd} {case}", _args(tpl, p, inp, out) + force, 2, name=out)
    o.run("capture -o existing", ["capture", "-o", str(box / "existing.cusnap"), "--", "touch", str(box / "ran")], 2,
          name=box / "existing.cusnap")           # refused before the program starts: it writes nothing
    if (box / "nope").exists():
        t.problem("missing_parent", "a command created a missing parent directory")
    # -f replaces what the command writes and keeps every other file
    o.run("repair -o -f", ["repair", str(p["damaged"]), "-o", str(box / "existing.cusnap"), "-f"], 0,
          replaced={"existing.cusnap"})
    o.run("stats --out -f", ["stats", str(p["snap"]), "--out", str(box / "existing.sqlite"), "-f"], 0,
          replaced={"existing.sqlite"})
    o.run("compare --html -f", ["compare", str(p["profile"]), str(p["profile2"]), "--html",
                                str(box / "existing.html"), "-f"], 0, replaced={"existing.html"})
    o.run("export -o DIR -f", ["export", str(p["snap"]), "-o", str(p["full"]), "-f"], 0,
          replaced={"full/Makefile"})
    if (p["full"] / "keep.txt").read_text() != "not export's" or not (p["full"] / "replay.c").exists():
        t.problem("export -o DIR -f", "export into a non-empty directory lost a file or wrote no program")
    o.run("replay --out --trace -f", ["replay", str(p["snap"]), "--profile", "timeline", "--out",
                                      str(box / "existing.json"), "--trace", str(box / "trace.json"), "-f"], 0,
          replaced={"existing.json"}, subprocess_=True)
    o.run("extract -o -f", ["extract", str(p["snap"]), "--kernel", ".", "-o", str(box / "existing.cusnap"), "-f"], 0,
          replaced={"existing.cusnap"}, subprocess_=True)


def check_bad_inputs(t: Tally, o: Outputs, p: dict, monkeypatch) -> None:
    """Damaged or empty inputs and failures midway: one line, exit 2, nothing left behind."""
    box = o.box
    empty = box / "empty.cusnap"
    SnapshotWriter(empty, {"format": "cudasnap", "schema": 1, "pid": 1}).close()
    o.run("export of a snapshot without calls", ["export", str(empty), "-o", str(box / "e1")], 2, name=empty)
    for cmd, extra in (("export", ["-o", str(box / "e2")]), ("extract", ["--kernel", ".", "-o", str(box / "e2.cusnap")])):
        o.run(f"{cmd} of a damaged snapshot", [cmd, str(p["damaged"]), *extra], 2)
    binary = box / "binary.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    o.run("bisect with a binary ENVS.toml", ["bisect", str(p["snap"]), "--envs", str(binary)], 2, name=binary)
    from cudasnap.export import emit

    def no_space(self):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(emit.Emitter, "makefile", no_space)
    try:
        o.run("export failing midway into a new directory", ["export", str(p["snap"]), "-o", str(box / "e3")], 2)
        o.run("export failing midway into a used directory", ["export", str(p["snap"]), "-o", str(p["full"]), "-f"], 2,
              replaced={"full/replay.c", "full/Makefile"} | {f"full/data/{x.name}" for x in (p["full"] / "data").glob("*")})
    finally:
        monkeypatch.undo()


def test_output_matrix(double, tmp_path, monkeypatch, record_property):
    t = Tally()
    snap = tmp_path / "captured.cusnap"
    cp = subprocess.run(_cudasnap("capture", "-q", "-o", str(snap), "--ring-mb", "16", "--",
                                  double["progs"]["direct"], "5"), env=double["env"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    profile = tmp_path / "profile.json"
    cp = subprocess.run(_cudasnap("replay", str(snap), "--profile", "timeline", "--out", str(profile), "-q"),
                        env=double["env"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    damaged = tmp_path / "damaged.cusnap"
    framed = tmp_path / "framed.cusnap"
    _rewrite(snap, framed, close=True)
    data = bytearray(framed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    box = tmp_path / "box"
    p = _sandbox(box, snap, damaged, profile)
    o = Outputs(t, box, double)
    check_command_outputs(t, o, p)
    check_bad_inputs(t, o, p, monkeypatch)
    record_property("ci_summary", f"output matrix: cases {t.cases}, files lost {t.lost}, tracebacks {t.tracebacks}, "
                                  f"wrong exit codes {t.wrong}, temporary files left {o.tmp_left}")
    assert t.cases >= 60
    assert t.tracebacks == 0 and t.wrong == 0 and t.lost == 0 and o.tmp_left == 0 and not t.problems, \
        "\n".join(t.problems)


# ------------------------------------------------------------------ faults beyond pipes (issue 60)
# in-process classes of tests/option_sweep.py, every k-th case here (all in bench/sweep_bad_inputs.py)
FAULT_STRIDE = {"special": 4, "identity": 1, "longname": 3, "environment": 2, "small": 1}


def test_faults_beyond_pipes(double, tmp_path_factory, record_property):
    """A report that cannot be written keeps its verdict (stdout full, closed, read-only; stdin
    closed; stderr full) for every command with one; SIGTERM and SIGHUP end every long command as
    Ctrl-C does, leaving no temporary file, directory or process; special files, links to the
    inputs, names at the limit and the window variables are refused before any work; two writers
    at once never both succeed on one file. Counts per class in CI's log."""
    import option_sweep as sweep
    import fault_cases as fc
    root = tmp_path_factory.mktemp("faults60")
    env = dict(double["env"])
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    w = fc.prepare(root / "fc", env, str(Path(double["libdir"]) / "libcuda.so.1"))
    results = fc.run_stream_cases(w, every=4)
    results += fc.run_signal_cases(w, sigs=(signal.SIGTERM,))
    results += fc.run_signal_cases(w, sigs=(signal.SIGHUP,), names=["replay", "export", "stats --out", "bisect"])
    results += fc.run_concurrent_writers(w, double["progs"]["direct"], captures=1, repairs=3)
    counts = fc.tally(results)
    slow = [f"{r.cls} {r.name}: ended {r.took:.1f} s after the signal" for r in results
            if r.cls.startswith("signal") and r.name.startswith("replay") and r.took is not None and r.took > 4]
    (root / "sweep").mkdir()
    work = sweep.prepare(root / "sweep", env, double["progs"]["direct"])
    cases = sweep.all_cases()
    bad = [f"{r.cls} {r.name}: {'; '.join(r.problems)} | {r.stderr.strip()[-200:]}" for r in results if r.problems]
    bad += slow                 # the GPU "works" (8 s kernels): the signal is honoured within about a second
    for cls, k in FAULT_STRIDE.items():
        got = [sweep.run_case(work, c) for c in cases[cls][::k]]
        counts[cls] = {"cases": len(got), "failed": sum(1 for o in got if o.problems)}
        bad += [f"{cls} {' '.join(o.case.args)[:160]}: {'; '.join(o.problems)} | {o.stderr.strip()[-160:]}"
                for o in got if o.problems]
    line = ", ".join(f"{cls} {t['cases'] - t['failed']}/{t['cases']}" for cls, t in counts.items())
    record_property("ci_summary", f"faults beyond pipes: {sum(t['cases'] for t in counts.values())} cases, "
                                  f"{len(bad)} failed ({line})")
    assert sum(t["cases"] for t in counts.values()) >= 150
    assert not bad, "\n".join(bad[:20])


def test_writers_claim_their_file(tmp_path):
    """The race two captures can lose: a snapshot file made exclusively ("new") or replaced under
    a lock ("replace") is never taken over by a second writer; the second gets FileExistsError
    and the first's file is untouched."""
    import pytest
    p = tmp_path / "x.cusnap"
    a = SnapshotWriter(p, {"pid": 1}, claim="new")
    a.write({"k": "c", "f": "cuInit", "s": 0})
    with pytest.raises(FileExistsError):
        SnapshotWriter(p, {"pid": 2}, claim="new")
    with pytest.raises(FileExistsError):
        SnapshotWriter(p, {"pid": 2}, claim="replace")
    a.close()
    with SnapshotReader(p) as r:
        assert r.raw_header["pid"] == 1 and not r.truncated
    b = SnapshotWriter(p, {"pid": 3}, claim="replace")      # -f once no one writes it: replaced
    b.close()
    with SnapshotReader(p) as r:
        assert r.raw_header["pid"] == 3


def test_outputs_are_created_exclusively(tmp_path):
    """An output checked without -f that another writer makes meanwhile is not replaced (the
    write fails naming it); an input is never replaced, by any name."""
    import pytest
    from cudasnap.formats.outputs import OutputError, Taken, check_output, reset, write_atomic
    reset()
    out = tmp_path / "r.json"
    check_output(out)
    out.write_text("the other writer's")
    with pytest.raises(Taken):
        write_atomic(out, "mine")
    assert out.read_text() == "the other writer's" and not list(tmp_path.glob(".*.tmp"))
    inp = tmp_path / "in.cusnap"
    inp.write_text("input")
    (tmp_path / "d").mkdir()
    os.link(inp, tmp_path / "d" / "Makefile")
    reset()
    check_output(tmp_path / "d", force=True, kind="dir", inputs=[inp])
    with pytest.raises(OutputError):
        write_atomic(tmp_path / "d" / "Makefile", "all:\n")
    assert inp.read_text() == "input"
    with pytest.raises(OutputError, match="too long"):
        check_output(tmp_path / ("n" * 250))
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(OutputError, match="missing"):
        check_output(tmp_path / "dangling", force=True)


def test_capture_settings_from_the_environment(double, tmp_path):
    """The shim's variables change what is recorded: CUDASNAP_WINDOW (with its values) is taken
    as the window it opens and said so; the others are echoed; both are kept in the snapshot
    and shown by info. A value that is no window is refused before the program runs."""
    env = dict(double["env"], CUDASNAP_WINDOW="launches", CUDASNAP_WIN_A="1", CUDASNAP_WIN_B="2",
               CUDASNAP_ALL_QUERIES="1")
    out = tmp_path / "w.cusnap"
    cp = subprocess.run(_cudasnap("capture", "-o", str(out), "--ring-mb", "16", "--", double["progs"]["direct"], "5"),
                        env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "window from CUDASNAP_WINDOW=launches CUDASNAP_WIN_A=1 CUDASNAP_WIN_B=2 (as --window launches:1-2)" \
        in cp.stderr and "recording set by the environment: CUDASNAP_ALL_QUERIES=1" in cp.stderr
    w1 = tmp_path / "w.w1.cusnap"
    with SnapshotReader(w1) as r:
        opts = r.raw_header["options"]
        assert opts["environment"] == {"CUDASNAP_ALL_QUERIES": "1"} and opts["window"]["spec"] == "launches:1-2"
    code, info, _ = cli(Tally(), "info", "info", str(w1))
    assert code == 0 and "settings : set by the environment: CUDASNAP_ALL_QUERIES=1; CUDASNAP_WINDOW=launches" in info
    ran = tmp_path / "ran"
    cp = subprocess.run(_cudasnap("capture", "-o", str(tmp_path / "x.cusnap"), "--", "touch", str(ran)),
                        env=dict(double["env"], CUDASNAP_WINDOW="launches:1-2"), capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 2 and "CUDASNAP_WINDOW=launches:1-2" in cp.stderr and not ran.exists()


def test_the_shims_variables_are_all_known():
    """Every CUDASNAP_* name the shim's sources read is one the runner sets, a window value or a
    setting echoed and recorded (capture/window.py): none changes a capture unsaid."""
    import re
    from cudasnap.capture import window as win
    shim = Path(__file__).resolve().parent.parent / "shim"
    names = set()
    for f in list(shim.glob("*.c")) + list(shim.glob("*.h")):
        names |= set(re.findall(r'"(CUDASNAP_[A-Z0-9_]+)"', f.read_text(errors="replace")))
    assert names, "no shim sources found"
    unknown = names - win._RUNNER_VARS - win._WINDOW_VARS - win.SHIM_SETTINGS
    assert not unknown, f"read by the shim but neither echoed nor recorded: {sorted(unknown)}"
