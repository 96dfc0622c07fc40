#!/usr/bin/env bash
# GPU demonstration of cudasnap with the habits of nsys, ncu and PyTorch profiler users:
#   1. capture a small PyTorch training loop that marks its steps with torch.cuda.nvtx.range_push/pop
#      (the program is not changed: capture makes the shim NVTX's injection library); `info` lists
#      the ranges;
#   2. replay it with --profile timeline --trace (the PyTorch profiler's Kineto layout) --out, and
#      check the trace against the --out JSON: the same launches (correlation = seq), the demangled
#      names of the same kernels, the same durations; the NVTX ranges on their own track; an arrow
#      from every launch call to its kernel;
#   3. ncu over a replay: `ncu --profile-from-start off -- cudasnap replay X --profiler-range workload`
#      profiles exactly the snapshot's launches (without --profiler-range, nothing: the program never
#      called cuProfilerStart); then ncu's own -k/-c against cudasnap's -k/-c: the same launches.
# Writes under $OUT: demo_habits.log, habits_trace.json.gz, habits_profile.json, habits_ncu.csv.
# Run from the project root on the GPU machine after bench/gpu_suite.sh installed the package
# (or with .whl carried: this script installs it the same way):
#   bash bench/demo_habits_gpu.sh
# Env: STEPS (training steps, default 3), NCU (the ncu binary, default: ncu on PATH or
# /usr/local/cuda/bin/ncu).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-habits; rm -rf "$W"; mkdir -p "$W"
STEPS=${STEPS:-3}
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
exec > >(tee "$OUT/demo_habits.log") 2>&1
. "$ROOT/bench/demo_lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd "$W"

cat > nvtx_torch.py <<'EOF'
import sys
import torch
torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256, device=dev)
y = torch.randint(0, 10, (64,), device=dev)
for step in range(int(sys.argv[1])):
    torch.cuda.nvtx.range_push(f"step {step}")
    torch.cuda.nvtx.range_push("forward")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("backward")
    opt.zero_grad()
    loss.backward()
    torch.cuda.nvtx.range_pop()
    opt.step()
    torch.cuda.nvtx.mark("step done")
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("loss", float(loss))
EOF

step "1. capture a PyTorch loop with torch.cuda.nvtx ranges ($STEPS steps)"
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
cudasnap capture -f -o torch.cusnap -- python3 nvtx_torch.py $STEPS || exit 2
cudasnap info torch.cusnap | sed -n '/NVTX ranges/,$p'
cudasnap info torch.cusnap --json > info.json
python3 - "$STEPS" <<'EOF'
import json, sys
steps = int(sys.argv[1])
nv = json.load(open("info.json"))["nvtx"] or {}
by = {(r["name"], r["kind"]): r for r in nv.get("by_name", [])}
ok = all(by.get((n, "range"), {}).get("count") == steps for n in ("forward", "backward"))
ok = ok and all(by.get((f"step {i}", "range"), {}).get("closed") == 1 for i in range(steps))
ok = ok and by.get(("step done", "mark"), {}).get("count") == steps
print(f"{'PASS' if ok else 'FAIL'}: info shows forward/backward x{steps}, step 0..{steps - 1}, mark 'step done' x{steps}")
sys.exit(0 if ok else 1)
EOF
[ $? = 0 ] || FAIL=1
cudasnap dump torch.cusnap | grep '^\[nvtx' | head -8

step "2. replay with a Kineto-style trace; its kernel rows against --out JSON"
cudasnap replay torch.cusnap --profile timeline --trace "$OUT/habits_trace.json.gz" --out "$OUT/habits_profile.json"
check $? "timeline replay verifies (exit 0)"
python3 - "$OUT/habits_trace.json.gz" "$OUT/habits_profile.json" <<'EOF'
import gzip, json, sys
from cudasnap.replay.names import demangle
tr = json.load(gzip.open(sys.argv[1], "rt"))
prof = json.load(open(sys.argv[2]))
evs = tr["traceEvents"]
kern = [e for e in evs if e.get("cat") == "kernel"]
rows = prof["launches"]
fails = []
if [e["args"]["correlation"] for e in kern] != [r["seq"] for r in rows]:
    fails.append("kernel correlations != --out seqs")
bad = [(e["name"], r["name"]) for e, r in zip(kern, rows) if e["name"] != demangle(r["name"]) or e["args"]["mangled"] != r["name"]]
if bad:
    fails.append(f"names differ: {bad[:2]}")
dt = [abs(e["dur"] - r["time_us"]) for e, r in zip(kern, rows) if "time_us" in r]
if not dt or max(dt) > 0.002:
    fails.append(f"durations differ by up to {max(dt) if dt else '?'} us")
flows = {e["id"] for e in evs if e["ph"] == "f"}
if not all(r["seq"] in flows for r in rows):
    fails.append("a launch without its ac2g flow")
nv = [e for e in evs if e.get("cat") == "nvtx"]
names = {e["name"] for e in nv}
if not {"forward", "backward", "step 0"} <= names:
    fails.append(f"NVTX ranges missing from the trace: {sorted(names)[:8]}")
cats = sorted({e.get("cat") for e in evs if e.get("cat")})
print(f"trace: {len(kern)} kernels, {sum(e.get('cat') == 'gpu_memcpy' for e in evs)} copies, "
      f"{sum(e.get('cat') == 'gpu_memset' for e in evs)} memsets, {sum(e.get('cat') == 'cuda_driver' for e in evs)} "
      f"driver calls, {len(nv)} NVTX events; categories {cats}")
for e, r in list(zip(kern, rows))[:3]:
    print(f"  #{r['seq']}  {e['dur']:.3f} us  {e['name'][:100]}")
print(("FAIL: " + "; ".join(fails)) if fails else
      f"PASS: the trace's {len(kern)} kernels are the --out rows (seq, demangled name, duration); NVTX ranges on their track")
sys.exit(1 if fails else 0)
EOF
[ $? = 0 ] || FAIL=1

step "3. ncu over a replay"
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
if [ ! -x "$NCU" ]; then
  echo "FAIL: ncu not found"; FAIL=1
else
  "$NCU" --version | tail -1
  LAUNCHES=$(python3 -c 'import json; print(json.load(open("info.json"))["kernels"]["launches"])')
  NAME=$(python3 -c '
import json
from cudasnap.replay.names import function_name
k = json.load(open("info.json"))["kernels"]["by_name"]
print(function_name(max(k, key=k.get)))')
  echo "snapshot: $LAUNCHES launches; most launched kernel (function name): $NAME"
  count() { python3 - "$1" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')) if r.get("ID", "").isdigit()]
ids = {}
for r in rows:
    ids.setdefault(r["ID"], (r.get("Kernel Name", ""), r.get("Grid Size", ""), r.get("Block Size", "")))
print(len(ids))
for i in sorted(ids, key=int)[:400]:
    print("\t".join(ids[i]))
EOF
  }
  NCUARGS=(--profile-from-start off --csv --metrics gpu__time_duration.sum)
  "$NCU" "${NCUARGS[@]}" --log-file "$W/ncu_workload.csv" -- cudasnap replay torch.cusnap --profiler-range workload -q
  echo "replay under ncu: exit $?"
  cp "$W/ncu_workload.csv" "$OUT/habits_ncu.csv"
  N1=$(count "$W/ncu_workload.csv" | head -1)
  [ "$N1" = "$LAUNCHES" ]; check $? "--profiler-range workload: ncu profiled $N1 kernels = the snapshot's $LAUNCHES launches"
  "$NCU" "${NCUARGS[@]}" --log-file "$W/ncu_plain.csv" -- cudasnap replay torch.cusnap -q
  N0=$(count "$W/ncu_plain.csv" | head -1)
  [ "$N0" = "0" ]; check $? "without --profiler-range: ncu profiled $N0 kernels (the program never started a range)"
  # ncu's own selection vs cudasnap's: the same launches (names, grids, blocks in order)
  "$NCU" "${NCUARGS[@]}" -k "$NAME" -s 1 -c 3 --log-file "$W/ncu_k.csv" -- cudasnap replay torch.cusnap --profiler-range workload -q
  "$NCU" "${NCUARGS[@]}" --log-file "$W/cs_k.csv" -- cudasnap replay torch.cusnap --profiler-range workload -q \
    --continue-on-error -k "$NAME" -s 1 -c 3
  echo "(cudasnap -k/-s/-c leaves the other launches out: its D2H results differ, exit 1 expected)"
  count "$W/ncu_k.csv" > ncu_k.txt; count "$W/cs_k.csv" > cs_k.txt
  echo "ncu -k $NAME -s 1 -c 3:"; sed 's/^/  /' ncu_k.txt
  echo "cudasnap replay -k $NAME -s 1 -c 3:"; sed 's/^/  /' cs_k.txt
  [ "$(head -1 ncu_k.txt)" = "3" ] && cmp -s ncu_k.txt cs_k.txt
  check $? "ncu's -k/-s/-c and cudasnap's -k/-s/-c select the same 3 launches"
fi

echo
[ $FAIL = 0 ] && echo "ALL PASS" || echo "SOME CHECKS FAILED"
exit $FAIL
