"""How often each command opens a snapshot and reads its records, counted (no GPU: the test double).

    python bench/count_passes.py [--launches 2000] [--frame-kb 64] [--json OUT]
    python bench/count_passes.py --snapshot SNAP [--snapshot SNAP2] [--json OUT]   # real snapshots, this GPU

Each command runs in a process of its own with an instrumented SnapshotReader (instrument()):
  opens          SnapshotReader objects made (each reads the header and index again)
  passes         walks over the records frames (record_payloads: records(), iteration, the plan),
                 with the place that asked for each
  decompressions records, header and index frames read and decompressed (chunks not counted)
  checksum       whole-file checksum passes (check_payloads, verify, check_records)
and `.records(` call sites in product code (--sites: only those, per file),
for `replay`, `replay --profile timeline|isolated`, a campaign cell (the server's check, then
the cell's profiled replay in the same process, as a kept or forked worker runs it), `extract`,
`export` and `info`, on a small snapshot and on a synthetic training loop.

instrument() is also what tests/test_structure.py counts a replay with."""
from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
_SKIP = ("formats/reader.py", "formats/opened.py", "count_passes.py", "contextlib.py")


def _caller() -> str:
    for fr in reversed(traceback.extract_stack()[:-2]):
        if not fr.filename.endswith(_SKIP):
            parts = Path(fr.filename).parts
            short = "/".join(parts[-2:])
            return f"{short}:{fr.name}"
    return "?"


def instrument() -> Dict[str, Any]:
    """Patch SnapshotReader in this process; returns the live counts."""
    from cudasnap.formats import reader as R
    counts: Dict[str, Any] = {"opens": 0, "passes": 0, "decompressions": 0, "checksum_passes": 0,
                              "open_sites": [], "pass_sites": []}
    cls = R.SnapshotReader
    init, payloads, read_frame = cls.__init__, cls.record_payloads, cls._read_frame

    def counted_init(self, *a, **kw):
        counts["opens"] += 1
        counts["open_sites"].append(_caller())
        return init(self, *a, **kw)

    def counted_payloads(self, *a, **kw):
        counts["passes"] += 1
        counts["pass_sites"].append(_caller())
        return payloads(self, *a, **kw)

    def counted_read(self, off, expect_kind=None, expect_digest=None, decode=None):
        kind, payload = read_frame(self, off, expect_kind, expect_digest, decode)
        if kind != R.KIND_CHUNK and decode is not False:
            counts["decompressions"] += 1
        return kind, payload

    def checksum(name):
        orig = getattr(cls, name)

        def run(self, *a, **kw):
            counts["checksum_passes"] += 1
            return orig(self, *a, **kw)
        return run

    cls.__init__, cls.record_payloads = counted_init, counted_payloads
    for name in ("check_payloads", "verify", "check_records"):
        setattr(cls, name, checksum(name))
    cls._read_frame = counted_read
    return counts


PRODUCT = ("advise", "campaign", "capture", "cli", "compare", "export", "formats", "replay", "shim")


def records_sites() -> Dict[str, int]:
    """`.records(` call sites in product code, per file (definitions not counted): each a
    reader of a snapshot's records, from the file or a replay's index."""
    import re
    out: Dict[str, int] = {}
    for d in PRODUCT:
        for p in sorted((ROOT / d).rglob("*.py")):
            n = sum(1 for ln in p.read_text().splitlines() if re.search(r"\.records\(", ln) and "def records" not in ln)
            if n:
                out[p.relative_to(ROOT).as_posix()] = n
    return out


def _child(out: str, mode: str, argv: List[str]) -> None:
    """Runs one command in this process, counting; the counts go to `out` at exit."""
    counts = instrument()

    def dump():
        Path(out).write_text(json.dumps(counts))
    atexit.register(dump)
    if mode in ("cell", "kept"):  # the campaign's cell server: check, then the cell's replay
        from cudasnap.replay.engine import close_replays, track_replays
        from cudasnap.replay.invocation import profiled, run
        from cudasnap.replay.preflight import snapshot_problem
        snap, prof = argv
        assert snapshot_problem(snap) is None
        track_replays()
        for _ in range(2 if mode == "kept" else 1):    # kept: a kept worker's replay after replay
            rc = run(profiled(snap, prof, "timeline"), checked=True)
            close_replays()
        sys.exit(rc)
    sys.argv = ["cudasnap", *argv]
    from cudasnap.entry import main
    main()


def _frames(snap: Path) -> int:
    from cudasnap.formats import SnapshotReader
    with SnapshotReader(snap) as r:
        return sum(1 for f in r.frames() if f[1] == "records")


def _double_snapshots(tmp: Path, a):
    """The test double's environment, its program and a synthetic training loop."""
    sys.path.insert(0, str(ROOT / "tests" / "double"))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    import build                                      # the test double's builder
    import synth
    from bench_graphmode_scale import loop_program
    env = dict(build.env_for(build.build(Path(os.environ.get("CUDASNAP_DOUBLE_BUILD_DIR") or tmp / "double"))))
    env.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    fb = a.frame_kb << 10
    small, loop = tmp / "small.cusnap", tmp / "loop.cusnap"
    synth.write_double_program(small, frame_bytes=fb)
    _orig = synth.Synth.__init__
    synth.Synth.__init__ = lambda self, path, header=None, frame_bytes=fb: _orig(self, path, header, frame_bytes)
    loop_program(loop, a.launches)
    return env, [small, loop]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--frame-kb", type=int, default=64, help="records frame size the snapshots are written with")
    ap.add_argument("--json")
    ap.add_argument("--only", help="comma list of commands to count (their first word: replay, campaign, "
                    "extract, export, info)")
    ap.add_argument("--snapshot", action="append", default=[], help="count on this snapshot (the machine's own "
                    "driver) instead of the double's synthetic ones")
    ap.add_argument("--sites", action="store_true", help="only count the `.records(` call sites in product code")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child[0], a.child[1], a.child[2:])
        return 0
    sites = records_sites()
    print(f"`.records(` call sites in product code: {sum(sites.values())} in {len(sites)} files")
    if a.sites:
        for f, n in sorted(sites.items(), key=lambda kv: -kv[1]):
            print(f"  {n:>3}  {f}")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="count-passes-"))
    if a.snapshot:
        env, snaps = dict(os.environ), [Path(p).resolve() for p in a.snapshot]
    else:
        env, snaps = _double_snapshots(tmp, a)
    rows = []
    for snap in snaps:
        cmds = {
            "replay": ["replay", str(snap), "-q"],
            "replay --profile timeline": ["replay", str(snap), "-q", "--profile", "timeline"],
            "replay --profile isolated": ["replay", str(snap), "-q", "--profile", "isolated", "--repeat", "2",
                                          "--warmup", "0", "-c", "3"],
            "campaign cell (timeline)": None,
            "extract --kernel": ["extract", str(snap), "--kernel", ".*", "-o", str(tmp / "x.cusnap"), "-f"],
            "export": ["export", str(snap), "-o", str(tmp / "exp"), "-f"],
            "info": ["info", str(snap)],
        }
        for what, cmd in cmds.items():
            if a.only and what.split()[0] not in a.only.split(","):
                continue
            res = tmp / "counts.json"
            if res.exists():
                res.unlink()
            if cmd is None:
                child = ["cell", str(snap), str(tmp / "cell.json")]
                if (tmp / "cell.json").exists():
                    (tmp / "cell.json").unlink()
            else:
                child = ["cli", *cmd]
            cp = subprocess.run([sys.executable, __file__, "--child", str(res), *child], env=env,
                                capture_output=True, text=True, timeout=600)
            c = json.loads(res.read_text()) if res.exists() else {}
            rows.append({"snapshot": snap.name, "records_frames": _frames(snap), "command": what,
                         "rc": cp.returncode, **c})
            if cp.returncode not in (0, 1):
                rows[-1]["stderr"] = cp.stderr[-400:]
    print(f"{'snapshot':<14}{'frames':>7}  {'command':<28}{'rc':>3}{'opens':>7}{'passes':>8}{'decomp':>8}{'cksum':>7}")
    for r in rows:
        print(f"{r['snapshot']:<14}{r['records_frames']:>7}  {r['command']:<28}{r['rc']:>3}{r.get('opens', '-'):>7}"
              f"{r.get('passes', '-'):>8}{r.get('decompressions', '-'):>8}{r.get('checksum_passes', '-'):>7}")
        if r.get("stderr"):
            print("    " + r["stderr"].strip().splitlines()[-1])
    print("\npasses by place, per command (first snapshot):")
    for r in rows[:len(rows) // len(snaps)]:
        print(f"  {r['command']}: {', '.join(r.get('pass_sites', []))}")
    print("\npasses by place (all commands):")
    sites: Dict[str, int] = {}
    for r in rows:
        for s in r.get("pass_sites", []):
            sites[s] = sites.get(s, 0) + 1
    for s, n in sorted(sites.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>4}  {s}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
