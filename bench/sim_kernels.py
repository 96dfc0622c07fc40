"""Helpers of the simulator correlation run (bench/sim_capture_gpu.sh, bench/sim_replay_cpu.sh).
  python3 sim_kernels.py specs SNAP           the extract spec (^NAME$#1) of each launched kernel
                                              whose PTX the snapshot holds (image or kept), one a line
  python3 sim_kernels.py column DIR           per program: kernels and GPU time the simulator can
                                              take (PTX) and the reasons of the others
  python3 sim_kernels.py merge DIR GPU SIM    one GPU timeline and one simulated profile of every
                                              program's kernels (names as PROGRAM:KERNEL), for
                                              `cudasnap compare GPU SIM`
DIR holds PROGRAM.cusnap, PROGRAM.info.json, PROGRAM.gpu.json and PROGRAM.*.sim.json."""
import glob
import json
import os
import re
import subprocess
import sys


def info(snap):
    path = snap[:-len(".cusnap")] + ".info.json"
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    out = subprocess.run(["cudasnap", "info", snap, "--json"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def ptx_kernels(d):
    """kernel -> where its PTX comes from (None: the module carries none)."""
    out = {}
    for m in d.get("module_images") or []:
        src = "image" if m.get("ptx") else m.get("ptx_from")
        for k in m.get("launched") or []:
            if out.get(k) is None:
                out[k] = src
    return out


def specs(snap):
    for k, src in sorted(ptx_kernels(info(snap)).items()):
        if src is not None:
            print(f"^{re.escape(k)}$#1")


def _gpu_times(path):
    with open(path) as f:
        prof = json.load(f)
    t = {}
    for r in prof.get("launches") or []:
        if isinstance(r.get("time_us"), (int, float)):
            t[r["name"]] = t.get(r["name"], 0.0) + r["time_us"]
    return prof, t


def column(d):
    print(f"{'program':<22} {'kernels':>8} {'with PTX':>9} {'GPU time':>10} {'with PTX':>9}  n/a (why)")
    for snap in sorted(glob.glob(os.path.join(d, "*.cusnap"))):
        p = os.path.basename(snap)[:-len(".cusnap")]
        if "." in p:                # an extract (PROGRAM.N.x)
            continue
        ks = ptx_kernels(info(snap))
        gpu = os.path.join(d, p + ".gpu.json")
        t = _gpu_times(gpu)[1] if os.path.exists(gpu) else {}
        total = sum(t.values())
        ok = sum(v for k, v in t.items() if ks.get(k))
        na = [k for k, s in ks.items() if s is None]
        print(f"{p:<22} {len(ks):>8} {sum(1 for s in ks.values() if s):>9} {total:>8.1f}us "
              f"{(ok / total * 100 if total else 0):>8.0f}%  "
              + (f"{len(na)} SASS only (no PTX in the image, none kept): {', '.join(n[:40] for n in na[:3])}"
                 f"{' ...' if len(na) > 3 else ''}" if na else "-"))


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
    elif cmd == "merge" and len(sys.argv) == 5:
        merge(*sys.argv[2:])
    else:
        sys.exit(__doc__)
