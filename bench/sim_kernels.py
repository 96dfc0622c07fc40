"""Helpers of the simulator correlation run (bench/sim_capture_gpu.sh, bench/sim_replay_cpu.sh).
  python3 sim_kernels.py specs SNAP           the extract spec (^NAME$#1) of each kernel that can run on
                                              the simulator (info --sim), one a line
  python3 sim_kernels.py column DIR           per program: its coverage (kernels and GPU time the
                                              simulator can take) and each n/a kernel with its reason
  python3 sim_kernels.py verdicts DIR         per program: each simulated extract's verdict (EXACT,
                                              CLOSE, DIFFERENT, refused), and the JIT kernels' (Triton,
                                              CuPy's NVRTC PTX) tally against the target
  python3 sim_kernels.py merge DIR GPU SIM    one GPU timeline and one simulated profile of every
                                              program's kernels (names as PROGRAM:KERNEL), for
                                              `cudasnap compare GPU SIM`
DIR holds PROGRAM.cusnap, PROGRAM.coverage.json (info --sim --timeline --json), PROGRAM.gpu.json,
PROGRAM.N.x.cusnap with PROGRAM.N.spec.txt (extracts), PROGRAM.N.sim.{txt,rc,json}."""
import glob
import json
import os
import re
import subprocess
import sys


def coverage(snap):
    """`cudasnap info SNAP --sim --json`, from PROGRAM.coverage.json where the GPU half wrote it."""
    path = snap[:-len(".cusnap")] + ".coverage.json"
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    out = subprocess.run(["cudasnap", "info", snap, "--sim", "--json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def specs(snap):
    for k in coverage(snap)["kernels"]:
        if k["runnable"] and k["launches"]:
            print(f"^{re.escape(k['name'])}$#1")


def jit(k):
    """A kernel compiled at run time: PTX handed to the driver, or a JIT compiler's cubin whose
    PTX capture kept (Triton's cache)."""
    return k.get("image") == "ptx" or k.get("ptx") not in (None, "image") and not str(k.get("ptx")).startswith("--")


def _gpu_times(path):
    with open(path) as f:
        prof = json.load(f)
    t = {}
    for r in prof.get("launches") or []:
        if isinstance(r.get("time_us"), (int, float)):
            t[r["name"]] = t.get(r["name"], 0.0) + r["time_us"]
    return prof, t


def programs(d):
    """(PROGRAM, its snapshot path): from its coverage JSON too, where the snapshot was too large
    to bring back."""
    stems = {os.path.basename(f)[:-len(ext)] for ext in (".cusnap", ".coverage.json")
             for f in glob.glob(os.path.join(d, "*" + ext))}
    for p in sorted(stems):
        if "." not in p:                 # not an extract (PROGRAM.N.x) or a child process (PROGRAM.PID)
            yield p, os.path.join(d, p + ".cusnap")


def column(d):
    for p, snap in programs(d):
        try:
            doc = coverage(snap)
        except (subprocess.CalledProcessError, ValueError) as e:
            print(f"{p}: no coverage ({e})")
            continue
        gaps = doc.get("snapshot_gaps") or []
        print(f"{p}: {doc['summary'].get('line')}" + (f"; a whole-snapshot replay meets {len(gaps)} more gap(s)" if gaps else ""))
        for k in doc["kernels"]:
            if not k["runnable"]:
                share = f" ({k['share_pct']:.1f}% of GPU time)" if k.get("share_pct") is not None else ""
                print(f"  n/a {(k.get('demangled') or k['name'])[:90]}{share}: {'; '.join(r['reason'] for r in k['reasons'])}")


def verdict(d, n):
    """EXACT, CLOSE, DIFFERENT, refused, unverified or failed, and a detail, of extract n's run."""
    try:
        with open(os.path.join(d, n + ".sim.rc")) as f:
            rc = int(f.read().strip())
        with open(os.path.join(d, n + ".sim.txt"), errors="replace") as f:
            text = f.read()
    except (OSError, ValueError):
        return "not simulated", ""
    last = next((l for l in reversed(text.splitlines()) if l.startswith(("OK:", "FAILED:", "cudasnap: error:"))), "")
    if rc == 0:
        m = re.search(r"D2H results: (\d+) EXACT, (\d+) CLOSE", text)
        if "0 D2H result(s) verified" in last and not m:
            return "unverified", last
        close = (m and int(m.group(2))) or "CLOSE within" in last
        return ("CLOSE" if close else "EXACT"), last
    if rc == 1:
        return "DIFFERENT", next((l for l in text.splitlines() if l.startswith("DIFFERENT:")), last)
    if rc == 2:
        return "refused", next((l for l in text.splitlines() if l.startswith("cudasnap: error:")), last)
    return "failed", f"exit {rc}" + (" (timed out)" if rc == 124 else "")


def _kernel_of(d, n):
    try:
        with open(os.path.join(d, n + ".spec.txt")) as f:
            spec = f.read().strip()
        return re.sub(r"\\(.)", r"\1", spec[1:spec.rindex("$#")])
    except (OSError, ValueError):
        out = subprocess.run(["cudasnap", "info", os.path.join(d, n + ".x.cusnap"), "--json"], capture_output=True,
                             text=True).stdout
        try:
            return next(iter(json.loads(out)["kernels"]["by_name"]), "?")
        except (ValueError, KeyError):
            return "?"


def verdicts(d):
    order = ("EXACT", "CLOSE", "DIFFERENT", "refused", "unverified", "failed", "not simulated", "not extracted")
    only = os.environ.get("ONLY", "").split()
    for p, snap in programs(d):
        if only and p not in only:
            continue
        try:
            doc = coverage(snap)
        except (subprocess.CalledProcessError, ValueError):
            continue
        got = {}
        for x in sorted(glob.glob(os.path.join(d, p + ".*.x.cusnap"))):
            n = os.path.basename(x)[:-len(".x.cusnap")]
            got[_kernel_of(d, n)] = verdict(d, n)
        tally = {"all": {}, "jit": {}}
        lines = []
        for k in doc["kernels"]:
            if not k["runnable"] or not k["launches"]:
                continue
            v, why = got.get(k["name"], ("not extracted", ""))
            for group in ("all",) + (("jit",) if jit(k) else ()):
                tally[group][v] = tally[group].get(v, 0) + 1
            if v not in ("EXACT", "CLOSE"):
                lines.append(f"  {v} {(k.get('demangled') or k['name'])[:80]}: {why[:200]}")
        jits = [k for k in doc["kernels"] if jit(k) and k["launches"]]
        jit_na = [k for k in jits if not k["runnable"]]

        def fmt(t):
            return ", ".join(f"{t[v]} {v}" for v in order if t.get(v)) or "none"
        s = doc["summary"]
        print(f"{p}: {s.get('runnable')} of {s.get('kernels')} kernels can run on the simulator; simulated: {fmt(tally['all'])}")
        ok = sum(tally["jit"].get(v, 0) for v in ("EXACT", "CLOSE"))
        print(f"  JIT kernels (Triton, PTX handed to the driver): {len(jits)}, {len(jit_na)} n/a; simulated: "
              f"{fmt(tally['jit'])}; target (every JIT kernel EXACT or CLOSE): "
              f"{'MET' if jits and ok == len(jits) else 'NOT MET' if jits else 'no JIT kernel'}")
        for k in jit_na:
            print(f"  n/a JIT kernel {k['name'][:80]}: {'; '.join(r['reason'] for r in k['reasons'])}")
        for l in lines:
            print(l)


def merge(d, gpu_out, sim_out):
    g_rows, s_rows, g_run, s_run, dropped = [], [], None, None, []
    for gpu in sorted(glob.glob(os.path.join(d, "*.gpu.json"))):
        p = os.path.basename(gpu)[:-len(".gpu.json")]
        if "." in p or os.path.abspath(gpu) == os.path.abspath(gpu_out):    # an extract's, or a merged one
            continue
        prof, _t = _gpu_times(gpu)
        g_run = g_run or prof.get("run")
        for r in prof.get("launches") or []:
            g_rows.append(dict(r, name=f"{p}:{r['name']}", index=len(g_rows)))
        for sim in sorted(glob.glob(os.path.join(d, p + ".*.sim.json"))):
            with open(sim) as f:
                sp = json.load(f)
            if sp.get("run", {}).get("exit_code") not in (0, None):
                dropped.append(f"{p}:{','.join(sorted({r['name'] for r in sp.get('launches') or []}))}")
                continue            # a simulation that did not verify is not a data point
            s_run = s_run or sp.get("run")
            for r in sp.get("launches") or []:
                s_rows.append(dict(r, name=f"{p}:{r['name']}", index=len(s_rows)))
    if g_run is None or s_run is None:
        sys.exit("merge: no GPU or no simulated profile found in " + d)
    from cudasnap.replay.profile.report import aggregate
    for rows, run, out in ((g_rows, g_run, gpu_out), (s_rows, s_run, sim_out)):
        run = dict(run, snapshot=os.path.abspath(d), snapshot_id=None)
        total = sum(r.get("time_us") or 0 for r in rows)
        doc = {"summary": {"mode": "timeline", "launches_timed": len(rows), "kernel_time_us": total},
               "kernels": aggregate(rows), "launches": rows, "snapshot": os.path.abspath(d), "warnings": [], "run": run}
        if run.get("simulated"):
            doc["summary"].update(simulated=True, backend="gpgpu-sim")
        with open(out, "w") as f:
            json.dump(doc, f)
    print(f"merged {len(g_rows)} GPU launches and {len(s_rows)} simulated launches"
          + (f"; left out, their results did not verify on the simulator: {', '.join(dropped)}" if dropped else ""))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "specs" and len(sys.argv) == 3:
        specs(sys.argv[2])
    elif cmd == "column" and len(sys.argv) == 3:
        column(sys.argv[2])
    elif cmd == "verdicts" and len(sys.argv) == 3:
        verdicts(sys.argv[2])
    elif cmd == "merge" and len(sys.argv) == 5:
        merge(*sys.argv[2:])
    else:
        sys.exit(__doc__)
