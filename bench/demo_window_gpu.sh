#!/usr/bin/env bash
# GPU checks of capture windows and the flight recorder.
#   1. --window nvtx: around one step of a PyTorch training loop: size vs the whole run, replay
#      exit 0 / 0 fell back / D2H verified, the step's kernel times vs a whole-run capture (+-5%);
#   2. --window launches: and --window profiler on an nvcc program (bench/window_loop.cu);
#   3. --flight-recorder on a loop that launches a kernel with an illegal address after
#      FLIGHT_FAIL_S seconds (default 20; 120 for a two-minute run): snapshot written, replay
#      reports the same error naming the kernel; steady-state overhead on a PyTorch loop (a checkpoint every FLIGHT_BENCH_PERIOD s, 30:
#      step p50 and mean with the pauses, the pauses);
#   4. the same loop killed with SIGKILL: a replayable snapshot (repaired if needed);
#   5. GPU hashing throughput and checkpoint bandwidth on a 10 GiB working set, with the card: the
#      program's pause (the copy into spare device memory) and the time until the state is on the host.
# Run from the project root on the GPU machine (with .whl holding the wheels the image lacks):
#   bash bench/demo_window_gpu.sh        (writes $OUT/demo_window.log; about 5-7 minutes)
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-window; rm -rf "$W"; mkdir -p "$W"
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
FLIGHT_FAIL_S=${FLIGHT_FAIL_S:-20}; FLIGHT_PERIOD=${FLIGHT_PERIOD:-8}; WS_MIB=${WS_MIB:-10240}
PARTS=${PARTS:-12345}   # which parts run (2 always: it builds the nvcc loop)
want() { [[ "$PARTS" == *$1* ]]; }
cd "$W"
exec > >(tee "$OUT/demo_window.log") 2>&1
check() { local ok=FAIL; [ "$2" = "$3" ] && ok=PASS; echo "$ok  $1 (exit $3, expected $2)${4:+  $4}"; }
yes_no() { if [ "$2" = 1 ]; then echo "PASS  $1${3:+  $3}"; else echo "FAIL  $1${3:+  $3}"; fi; }
CARD=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "card: $CARD"
T0=$SECONDS

# ---- 1. PyTorch: --window nvtx: around one training step (the 5th "step" range; loss.item() inside it)
if want 1; then
TRAIN=(python3 "$ROOT/bench/bench_flight_gpu.py" loop 0 4096)
"${TRAIN[@]}" | grep -v STEP_MS > native.txt
cudasnap capture -f -o whole.cusnap -- "${TRAIN[@]}" > whole.txt 2> whole.err
grep -v STEP_MS whole.txt | cmp -s - native.txt; check "PyTorch: whole-run capture, output identical" 0 $?
cudasnap capture -f -o win.cusnap --window "nvtx:step#5" -- "${TRAIN[@]}" > win.txt 2> win.err
grep -v STEP_MS win.txt | cmp -s - native.txt; check "PyTorch: --window nvtx:step#5, output identical" 0 $?
[ -f win.w1.cusnap ] && [ ! -f win.w2.cusnap ]; check "one windowed snapshot (win.w1.cusnap)" 0 $?
cat win.err
cudasnap replay win.w1.cusnap > win_replay.txt 2>&1; rc=$?; tail -4 win_replay.txt
check "replay of the windowed step" 0 $rc
grep -q " 0 fell back" win_replay.txt; check "windowed replay: 0 fell back" 0 $?
grep -Eq "D2H verified +[1-9]" win_replay.txt; check "windowed replay: D2H verified" 0 $?
cat > steps.py <<'EOF'
from cudasnap.formats import SnapshotReader
def step_seqs(path, k=5, name="step"):
    """Sequence numbers of the calls inside the k-th NVTX range `name`."""
    n, inside, seqs = 0, False, set()
    for r in SnapshotReader(path).records():
        if r["k"] == "nvtx" and r.get("name") == name and r.get("op") in ("push", "start"):
            n += 1
            inside = n == k
        elif r["k"] == "nvtx" and r.get("name") == name:
            inside = False
        elif r["k"] == "c" and inside:
            seqs.add(r["s"])
    return seqs
EOF
python3 - <<'EOF'
import os
from cudasnap.formats import SnapshotReader
from steps import step_seqs
w = SnapshotReader("win.w1.cusnap")
recs = list(w.records())
st = [r for r in recs if r["k"] == "win" and r["op"] == "state"][0]
win_calls = sum(1 for r in recs if r["k"] == "c" and not r.get("state"))
state_calls = sum(1 for r in recs if r["k"] == "c" and r.get("state"))
opened = recs.index([r for r in recs if r["k"] == "win" and r["op"] == "open"][0])
in_window = sum(1 for r in recs[opened:] if r["k"] == "c" and not r.get("state"))
seqs = step_seqs("whole.cusnap")
whole_step = len(seqs)
# one step's payload in the whole run: the data its calls carry (uploads, read-backs)
step_bytes = sum(v["size"] for r in SnapshotReader("whole.cusnap").records() if r["k"] == "c" and r["s"] in seqs
                 for v in (r.get("x") or {}).values() if isinstance(v, dict) and isinstance(v.get("size"), int))
ws, wh = os.path.getsize("win.w1.cusnap"), os.path.getsize("whole.cusnap")
bound = st["bytes"] + step_bytes
# a windowed snapshot holds all live memory (the state); a whole-run capture only what was uploaded
print(f"windowed snapshot {ws / 2**20:.1f} MiB; state {st['bytes'] / 2**20:.1f} MiB in {st['ranges']} ranges "
      f"({state_calls} restore records, {win_calls - in_window} state-creating calls kept) + one step's data "
      f"{step_bytes / 2**20:.1f} MiB = {bound / 2**20:.1f} MiB; whole run {wh / 2**20:.1f} MiB; calls inside the "
      f"window {in_window} (the same step in the whole run: {whole_step})")
print(("PASS" if ws <= bound * 1.01 + (4 << 20) and in_window <= whole_step + 2 else "FAIL")
      + "  windowed snapshot is at most the state plus one step")
EOF
cudasnap replay whole.cusnap --profile timeline --out whole_tl.json > /dev/null 2>&1; r1=$?
cudasnap replay win.w1.cusnap --profile timeline --out win_tl.json > /dev/null 2>&1; r2=$?
check "timeline profiles (whole run, window)" "0 0" "$r1 $r2"
python3 - <<'EOF'
import json
from steps import step_seqs
def launches(js, seqs=None):
    d = json.load(open(js))
    rows = d.get("launches") or d.get("report", {}).get("launches") or []
    return [(r["name"], r["time_us"]) for r in rows if r.get("time_us") is not None and (seqs is None or r["seq"] in seqs)]
whole = launches("whole_tl.json", step_seqs("whole.cusnap"))
win = launches("win_tl.json")
tw, tn = sum(t for _, t in whole), sum(t for _, t in win)
same = [n for n, _ in whole] == [n for n, _ in win]
print(f"step 5 kernels: whole run {len(whole)} launches {tw:.1f} us, window {len(win)} launches {tn:.1f} us "
      f"({100 * (tn - tw) / tw if tw else 0:+.1f}%), same kernels in order: {same}")
ok = same and tw > 0 and abs(tn - tw) <= 0.05 * tw
print(("PASS" if ok else "FAIL") + "  window's step kernel timings within 5% of the whole-run capture's")
EOF
echo "part 1: $((SECONDS - T0)) s"
fi

# ---- 2. nvcc program: --window launches: and --window profiler
nvcc -O2 -o window_loop "$ROOT/bench/window_loop.cu" || { echo "FAIL  nvcc window_loop.cu"; exit 1; }
./window_loop 40 512 | grep -v STEP_US > loop_native.txt
for spec in launches:30-45 profiler; do
  tag=${spec%%:*}
  cudasnap capture -f -o "$tag.cusnap" --window "$spec" -- ./window_loop 40 512 > "$tag.out" 2> "$tag.err"
  grep -v STEP_US "$tag.out" | cmp -s - loop_native.txt; check "nvcc: --window $spec, output identical" 0 $?
  cat "$tag.err"
  cudasnap replay "$tag.w1.cusnap" > "$tag.replay" 2>&1; rc=$?; tail -2 "$tag.replay"
  grep -q " 0 fell back" "$tag.replay" && [ $rc = 0 ]; check "nvcc: replay of --window $spec (exit 0, 0 fell back)" 0 $?
done
n=$(python3 -c "
from cudasnap.formats import SnapshotReader
print(sum(1 for r in SnapshotReader('profiler.w1.cusnap').records() if r['k']=='c' and r['f'].startswith('cuLaunch') and not r.get('state')))")
[ "$n" = 6 ]; check "profiler window holds steps 5-7 (6 launches, got $n)" 0 $?
echo "part 2: $((SECONDS - T0)) s"

# ---- 3. flight recorder: illegal address after FLIGHT_FAIL_S seconds
cudasnap capture -f -o flight.cusnap --flight-recorder=$FLIGHT_PERIOD -- ./window_loop 0 2048 $FLIGHT_FAIL_S 10 2000 > flight.out 2> flight.err; rc=$?
cat flight.out | tail -3; cat flight.err
check "flight: the program fails as natively (exit 1)" 1 $rc
[ -f flight.cusnap ]; check "flight: snapshot written on the error" 0 $?
python3 - <<'EOF'
import os, re
m = re.search(r"launching bad_kernel after [\d.]+ s at ([\d.]+)", open("flight.out").read())
if m and os.path.exists("flight.cusnap"):
    dt = os.path.getmtime("flight.cusnap") - float(m.group(1))
    print(f"failure to complete snapshot on disk: {dt:.1f} s ({os.path.getsize('flight.cusnap') / 2**20:.1f} MiB)")
    print(("PASS" if dt <= 10 else "FAIL") + "  snapshot complete within 10 s of the failure")
EOF
ls flight*.cusnap
cudasnap info flight.cusnap | grep -E "window|calls|file"
cudasnap replay flight.cusnap > flight.replay 2>&1; rc=$?; tail -6 flight.replay
grep -Eq "recorded error CUDA_ERROR_ILLEGAL_ADDRESS recurred.*bad_kernel" flight.replay
check "flight: replay reaches the failing call and reports ILLEGAL_ADDRESS naming bad_kernel" 0 $? "(replay exit $rc)"
python3 "$ROOT/bench/bench_flight_gpu.py" compare ${FLIGHT_BENCH_S:-70} ${FLIGHT_BENCH_PERIOD:-30}
echo "part 3: $((SECONDS - T0)) s"

# ---- 4. flight recorder: SIGKILL from outside
cudasnap capture -f -o killed.cusnap --flight-recorder=5 -- ./window_loop 100000000 2048 -1 10 2000 > killed.out 2> killed.err &
CAP=$!
sleep 15
PROG=$(cat /proc/$CAP/task/$CAP/children | awk "{print \$1}")
kill -9 "$PROG"; wait $CAP; rc=$?
cat killed.err
check "flight: program killed by SIGKILL (cudasnap exit 137)" 137 $rc
if [ -f killed.cusnap ]; then
  cudasnap info killed.cusnap > /dev/null 2>&1 || cudasnap repair killed.cusnap
  cudasnap replay killed.cusnap > killed.replay 2>&1; rc=$?; tail -3 killed.replay
  check "flight: SIGKILL snapshot replays" 0 $rc
else
  p=$(ls killed.flight*.partial.cusnap 2>/dev/null | head -1)
  echo "no killed.cusnap; repairing $p"; cudasnap repair "$p" -o killed.cusnap
  cudasnap replay killed.cusnap > killed.replay 2>&1; check "flight: SIGKILL snapshot replays after repair" 0 $?
fi
echo "part 4: $((SECONDS - T0)) s"

# ---- 5. hashing throughput and checkpoint bandwidth, $WS_MIB MiB working set
if want 5; then
cudasnap capture -f -o bw.cusnap --flight-recorder=6 -- ./window_loop 100000000 $WS_MIB -1 0 2000 > bw.out 2> bw.err &
CAP=$!
sleep 28
kill -USR2 $CAP; sleep 4; kill -TERM $CAP; wait $CAP
echo "card: $CARD"
grep -E "checkpoint|flight" bw.err
python3 - "$CARD" <<'EOF'
import re, sys
rows = []
for line in open("bw.err").read().splitlines():
    m = re.search(r"checkpoint (\d+): state ([\d.]+) GiB, program paused ([\d.]+) ms \(([\d.]+) GB/s\), "
                  r"complete after ([\d.]+) ms, copied ([\d.]+) GiB, unchanged ([\d.]+) GiB", line)
    if not m:
        continue
    h = re.search(r"GPU hashing [\d.]+ GiB at ([\d.]+) GB/s", line)
    sp = re.search(r"spare device memory ([\d.]+) GiB", line)
    wt = re.search(r"waited ([\d.]+) ms", line)
    rows.append(dict(n=int(m[1]), gib=float(m[2]), pause=float(m[3]), bw=float(m[4]), done=float(m[5]),
                     copied=float(m[6]), unchanged=float(m[7]), hash=float(h[1]) if h else 0.0,
                     spare=float(sp[1]) if sp else 0.0, wait=float(wt[1]) if wt else 0.0))
if not rows:
    print("FAIL  no checkpoint figures in the capture summary"); sys.exit()
for r in rows:
    drain = r["gib"] * 2**30 / (r["done"] / 1e3) / 1e9 if r["done"] else 0
    print(f"{sys.argv[1]}: checkpoint {r['n']}: {r['gib']} GiB state, program paused {r['pause']:.1f} ms "
          f"({r['bw']} GB/s), complete on the host after {r['done'] / 1e3:.2f} s ({drain:.1f} GB/s), copied "
          f"{r['copied']} GiB, unchanged {r['unchanged']} GiB, spare device memory {r['spare']} GiB, waited "
          f"{r['wait']:.0f} ms for the previous drain" + (f", GPU hash {r['hash']} GB/s" if r["hash"] else ", no GPU hashing"))
full = rows[0]
inc = [r for r in rows[1:] if r["unchanged"] > 0]
best_hash = max((r["hash"] for r in rows), default=0.0)
best_inc = max((r["bw"] for r in inc), default=0.0)
print(("PASS" if best_hash >= 500 else "FAIL") + f"  GPU hashing >= 500 GB/s ({best_hash:.0f} GB/s)")
print(("PASS" if full["bw"] >= 20 else "FAIL") + f"  full state snapshot >= 20 GB/s ({full['gib']} GiB, program paused "
      f"{full['pause']:.1f} ms: {full['bw']:.1f} GB/s)")
print(("PASS" if best_inc >= 20 else "FAIL") + f"  incremental checkpoint >= 20 GB/s ({best_inc:.1f} GB/s)")
EOF
fi
echo "total: $((SECONDS - T0)) s"
