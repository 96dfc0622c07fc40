"""Fault matrix over selections: -c, -s, -k, --kernels, --calls (and extract's --launch, --kernel,
--calls; export's --calls) with valid, empty, out-of-range and invalid values, on replay, a
timeline profile, extract and export, on a snapshot of the test double. For every case: no
traceback; exit 0 for a selection that selects work (and no MISMATCH: a partial replay compares
only what it determines), exit 2 with exactly one line on stderr for one that selects nothing or
cannot be read, and no output left by a refusal. The counts are printed, and must all be 0. One
interpreter runs every case, each in a forked child."""
from __future__ import annotations

import json
import subprocess
import sys

from cudasnap.formats import SnapshotReader

WORKER = r"""
import json, os, sys, traceback
from cudasnap.cli import main
# what every case imports, imported once before the forks
import cudasnap.replay.engine, cudasnap.replay.profile, cudasnap.replay.profile.timeline, cudasnap.export.extract
import cudasnap.export.emit
try:
    from cuda.bindings import driver  # noqa: F401
except ImportError:
    pass
out = []
for i, argv in enumerate(json.loads(sys.stdin.read())):
    base = os.path.join(os.environ["SEL_LOGS"], str(i))
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        import signal
        signal.alarm(90)
        for fd, name in ((1, ".out"), (2, ".err")):
            f = os.open(base + name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
        sys.argv = ["cudasnap", *argv]
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except BaseException:
            traceback.print_exc()
            code = 99
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    out.append([os.waitstatus_to_exitcode(status), open(base + ".out", errors="replace").read(),
                open(base + ".err", errors="replace").read()])
print(json.dumps(out))
"""

VALID, EMPTY, RANGE, INVALID = "valid", "empty", "out-of-range", "invalid"


def _selections(launch_seq: int):
    """(kind, args) for replay and profile; the snapshot has 20 launches of add_one and incr
    in 113 calls (#0-#112)."""
    return [
        (VALID, ["-c", "1"]), (VALID, ["-s", "3"]), (VALID, ["-c", "2", "-s", "4"]), (VALID, ["-s", "19"]),
        (VALID, ["-k", "add_one"]), (VALID, ["-k", "regex:inc"]), (VALID, ["--kernels", "add"]),
        (VALID, ["--calls", "10-30"]), (VALID, ["--calls", "0-112"]), (VALID, ["--launch", str(launch_seq)]),
        (EMPTY, ["-k", "nomatch"]), (EMPTY, ["-k", "regex:^zzz$"]), (EMPTY, ["--kernels", "zzz"]),
        (EMPTY, ["--calls", "18-19"]),
        (RANGE, ["--calls", "200-300"]), (RANGE, ["--calls", "9999"]), (RANGE, ["-s", "20"]),
        (RANGE, ["-c", "1", "-s", "1000"]), (RANGE, ["--launch", "9999"]),
        (INVALID, ["-k", "regex:("]), (INVALID, ["--kernels", "(["]), (INVALID, ["-c", "0"]), (INVALID, ["-c", "-1"]),
        (INVALID, ["-s", "-1"]), (INVALID, ["--calls", "5-3"]), (INVALID, ["-c", "abc"]),
    ]


def _extract_selections(launch_seq: int):
    return [
        (VALID, ["--launch", str(launch_seq)]), (VALID, ["--kernel", "add_one"]), (VALID, ["--kernel", "incr#3"]),
        (VALID, ["--calls", "10-40"]), (VALID, ["--calls", "13-17"]), (VALID, ["--calls", "100-200"]),
        (EMPTY, ["--kernel", "nomatch"]), (EMPTY, ["--calls", "18-19"]),
        (RANGE, ["--launch", "9999"]), (RANGE, ["--kernel", "add_one#99"]), (RANGE, ["--calls", "200-300"]),
        (INVALID, ["--kernel", "("]), (INVALID, ["--kernel", "add#0"]), (INVALID, ["--calls", "5-3"]),
        (INVALID, ["--calls", "x"]), (INVALID, ["--launch", "abc"]), (INVALID, []),
        (INVALID, ["--launch", str(launch_seq), "--kernel", "add_one"]),
    ]


def test_selection_fault_matrix(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["windowed"])
    assert cp.returncode == 0, cp.stderr
    with SnapshotReader(snap) as r:
        launches = [c["s"] for c in r.records("c") if c["f"].startswith("cuLaunch")]
    assert len(launches) == 20
    cases = []
    for i, (kind, args) in enumerate(_selections(launches[6])):
        cases.append(("replay", kind, ["replay", str(snap), *args]))
        if i % 3 == 0 or args[0] == "-k":     # a profile selects as replay does: some of the cases
            cases.append(("profile", kind, ["replay", str(snap), "--profile", "timeline", *args]))
    for i, (kind, args) in enumerate(_extract_selections(launches[6])):
        cases.append(("extract", kind, ["extract", str(snap), "-o", str(tmp_path / f"x{i}.cusnap"), *args]))
    for i, (kind, rng) in enumerate([(VALID, "10-30"), (EMPTY, "18-19"), (RANGE, "9999"), (INVALID, "5-3")]):
        cases.append(("export", kind, ["export", str(snap), "-o", str(tmp_path / f"e{i}"), "--calls", rng]))
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(double["env"], SEL_LOGS=str(logs))
    run = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps([c[2] for c in cases]), env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    counts = {"cases": len(cases), "tracebacks": 0, "wrong exit codes": 0, "exit 2 without one stderr line": 0,
              "false MISMATCH": 0, "output left by a refusal": 0}
    problems = []
    for (cmd, kind, argv), (code, out, err) in zip(cases, results):
        want = 0 if kind == VALID else 2
        text = out + err
        bad = []
        if "Traceback" in text:
            counts["tracebacks"] += 1
            bad.append("traceback")
        if code != want:
            counts["wrong exit codes"] += 1
            bad.append(f"exit {code}, want {want}")
        if code == 2 and len([ln for ln in err.splitlines() if ln.strip()]) != 1:
            counts["exit 2 without one stderr line"] += 1
            bad.append("stderr is not one line")
        if kind == VALID and ("MISMATCH" in text or "DIFFERENT:" in text):
            counts["false MISMATCH"] += 1
            bad.append("MISMATCH")
        if cmd in ("extract", "export") and code != 0 and (tmp_path / argv[3].rsplit("/", 1)[-1]).exists():
            counts["output left by a refusal"] += 1
            bad.append("output left")
        if bad:
            problems.append(f"{cmd} {kind} {' '.join(argv[2:])}: {', '.join(bad)}: {(err or out).strip()[-300:]}")
    print("selection fault matrix: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for p in problems:
        print("  " + p)
    assert all(v == 0 for k, v in counts.items() if k != "cases"), "\n".join(problems)
