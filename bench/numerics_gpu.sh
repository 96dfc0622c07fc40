#!/usr/bin/env bash
# GPU demonstration of replay's numerics (EXACT / CLOSE / DIFFERENT), one call on one GPU (~7 min):
#   1. builds bench/numerics_stencil.cu (a C++ template stencil, float, FMAs; SASS sm_90 + PTX)
#      and its -G cubin (no contraction: last bits differ, several times slower), and the float
#      workloads sim_sgemm, sim_stencil, sim_streams;
#   2. the stencil: replay (EXACT, exit 0), the -G build swapped in (--replace: CLOSE, exit 0, its
#      numbers), the same with --exact (exit 1), with --jit ptx; a kernel that computes something
#      else is not available here, so that case is the CI's (tests/test_numerics.py);
#   3. captures and extracts one launch of each float kernel (template stencil, jacobi, tiled
#      SGEMM, row normalization, the streams' saxpy step) with --check, packed into
#      $OUT/numerics_sim.tar.xz for GPGPU-Sim on a CPU machine:
#        tar xJf numerics_sim.tar.xz -C DIR; CUDASNAP_GPGPUSIM=... bash bench/numerics_sim_cpu.sh DIR
#   4. a campaign on this GPU: 8 programs (the stencil, demo_ab, ptrs, mt_launch, sim_sgemm,
#      sim_streams, PyTorch MLP inference and eager) x plain, a no-op control, eager loading and the
#      -G stencil swapped in (CUDASNAP_REPLACE): the -G cell must be SLOWER with numerics CLOSE, and
#      no other cell a verdict (eager-loading verdicts are listed apart).
# Writes $OUT/numerics.log, numerics_summary.json, numerics_sim.tar.xz, campaign report and store.
# Run from the project root (carry .whl, with Ray unpacked into /tmp/site as for campaign_gpu.sh):
#   bash bench/numerics_gpu.sh
# Env: ARCH (default sm_90), REPEAT (isolated repeats, default 5), THRESHOLD (percent, default 10),
# NO_CAMPAIGN=1 (steps 1-3 only, about 2 minutes).
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-numerics; rm -rf "$W"; mkdir -p "$W/snaps" "$W/sim" "$W/logs"
ARCH=${ARCH:-sm_90}; REPEAT=${REPEAT:-5}; THRESHOLD=${THRESHOLD:-10}
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
. "$ROOT/bench/demo_lib.sh"
exec > >(tee -a "$OUT/numerics.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
WL=$ROOT/tests/gpu/workloads
cd "$W"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

step "1. build ($ARCH, PTX beside SASS)"
GEN="-gencode arch=compute_${ARCH#sm_},code=$ARCH -gencode arch=compute_75,code=compute_75"
nvcc -O3 $GEN -o numerics_stencil "$ROOT/bench/numerics_stencil.cu" || exit 2
nvcc -G -cubin -arch=$ARCH -o stencil_G.cubin "$ROOT/bench/numerics_stencil.cu" || exit 2
for p in sim_sgemm sim_stencil sim_streams; do nvcc -O2 $GEN -o $p "$WL/$p.cu" || exit 2; done
nvcc -O3 -arch=$ARCH -o demo_ab "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -O2 -cudart static -arch=$ARCH -o ptrs "$WL/ptrs.cu" || exit 2
nvcc -O2 -std=c++17 -cudart static -arch=$ARCH -o mt_launch "$WL/mt_launch.cu" -lpthread || exit 2

step "2. the stencil: EXACT, the -G swap CLOSE, --exact DIFFERENT"
cudasnap capture -q -o snaps/stencil.cusnap -- ./numerics_stencil 20; echo "capture exit $?"
K=$(cudasnap dump snaps/stencil.cusnap --calls launches 2>/dev/null | grep -o '_Z[0-9]*stencilI[A-Za-z0-9_]*' | head -1)
echo "kernel: $K"
[ -n "$K" ] || { echo "FAIL: no stencil launch in the snapshot"; exit 2; }
cudasnap replay snaps/stencil.cusnap > logs/plain.txt 2>&1; rc=$?
grep -E '^(numerics|D2H results|CLOSE|DIFFERENT|OK|FAILED)' logs/plain.txt; check $([ $rc = 0 ] && grep -q ' 0 CLOSE, 0 DIFFERENT' logs/plain.txt; echo $?) "same kernels: EXACT, exit 0"
cudasnap replay snaps/stencil.cusnap --replace "$K=stencil_G.cubin" > logs/swap.txt 2>&1; rc=$?
grep -E '^(numerics|D2H results|CLOSE|DIFFERENT|recheck|OK|FAILED)' logs/swap.txt
check $([ $rc = 0 ] && grep -q '^CLOSE: ' logs/swap.txt; echo $?) "-G build swapped in: CLOSE, exit 0"
cudasnap replay snaps/stencil.cusnap --replace "$K=stencil_G.cubin" --json > logs/swap.json 2>/dev/null
cudasnap replay snaps/stencil.cusnap --replace "$K=stencil_G.cubin" --exact > logs/swap_exact.txt 2>&1; rc=$?
grep -E '^(numerics|D2H results|DIFFERENT|FAILED)' logs/swap_exact.txt | cut -c1-400
check $([ $rc = 1 ]; echo $?) "-G build swapped in with --exact: exit 1"
cudasnap replay snaps/stencil.cusnap --jit ptx > logs/jit.txt 2>&1; echo "--jit ptx: exit $? $(grep -E '^D2H results' logs/jit.txt)"

step "3. float kernels captured and extracted for the simulator"
cap() { cudasnap capture -q -o "snaps/$1.cusnap" -- "${@:2}" > "logs/$1.cap.txt" 2>&1; echo "capture $1 exit $?"; }
cap sim_sgemm ./sim_sgemm; cap sim_stencil ./sim_stencil; cap sim_streams ./sim_streams
# snapshot : the launch to extract (REGEX#K) : the extract's name
for pick in "stencil:stencilI#3:sim_num_stencil" "sim_stencil:jacobi#3:sim_num_jacobi" "sim_sgemm:sgemm#1:sim_num_sgemm" \
            "sim_sgemm:rownorm#1:sim_num_rownorm" "sim_streams:saxpy#3:sim_num_saxpy"; do
  IFS=: read -r src k n <<< "$pick"
  cudasnap extract "snaps/$src.cusnap" --kernel "$k" -o "sim/$n.x.cusnap" --check -f > "logs/$n.extract.txt" 2>&1
  echo "extract $src $k exit $? ($(stat -c %s "sim/$n.x.cusnap" 2>/dev/null) bytes): $(grep 'check:' "logs/$n.extract.txt" | tail -1 | cut -c1-160)"
done
nvidia-smi --query-gpu=name --format=csv,noheader > sim/card.txt
tar -cJf "$OUT/numerics_sim.tar.xz" -C sim . && ls -la sim

[ -n "${NO_CAMPAIGN:-}" ] && { echo "step 4 (the campaign) not run: NO_CAMPAIGN is set"; exit 0; }
step "4. campaign: 8 programs x plain, control, eager loading, the -G stencil"
python3 -c 'import ray' 2>/dev/null || { echo "FAIL: Ray is not importable (unpack it into /tmp/site)"; exit 2; }
pids=()
cap demo_ab ./demo_ab 4194304 8 & pids+=($!); cap ptrs ./ptrs & pids+=($!); cap mt_launch ./mt_launch 4 8 & pids+=($!)
wait "${pids[@]}"
cap torch_mlp_infer python3 "$ROOT/bench/demo_torch_mlp.py" 16 2048; cap torch_eager python3 "$WL/torch_eager.py"
ls snaps/*.cusnap | wc -l | xargs echo "snapshots:"
cat > campaign.toml <<EOF
name = "numerics"
baseline = "plain"
[rules]
repeats = $REPEAT
warmup = 2
threshold = $THRESHOLD
max_reruns = 1
timeout = 240
retries = 1
[[snapshot]]
path = "snaps/stencil.cusnap"
[[snapshot]]
path = "snaps/demo_ab.cusnap"
[[snapshot]]
path = "snaps/ptrs.cusnap"
[[snapshot]]
path = "snaps/mt_launch.cusnap"
[[snapshot]]
path = "snaps/sim_sgemm.cusnap"
[[snapshot]]
path = "snaps/sim_streams.cusnap"
[[snapshot]]
path = "snaps/torch_*.cusnap"
profile = "timeline"
[[env]]
name = "plain"
[[env]]
name = "control"
control = true
vars = { CUDASNAP_CAMPAIGN_NOTHING = "1" }
[[env]]
name = "eager-loading"
vars = { CUDA_MODULE_LOADING = "EAGER" }
[[env]]
name = "G-stencil"
vars = { CUDASNAP_REPLACE = "$K=$W/stencil_G.cubin" }
EOF
cp campaign.toml "$OUT/numerics_campaign.toml"
T=$SECONDS
timeout 300 cudasnap campaign run campaign.toml -o numerics.sqlite --json > logs/campaign.json 2> logs/campaign.err
rc=$?; echo "campaign exit $rc in $((SECONDS - T)) s"; tail -3 logs/campaign.err
python3 - logs/campaign.json <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
per_h = round(d["ran"] / d["cells_wall_s"] * 3600) if d.get("cells_wall_s") else None
print(f"campaign throughput: {d.get('ran')} cells in {d.get('cells_wall_s')} s on {d.get('gpus')} GPU(s): "
      f"{per_h} cells/h; cost {d.get('cost')}")
PYEOF
cudasnap campaign report numerics.sqlite > "$OUT/numerics_report.txt" 2>&1; echo "report exit $?"
python3 -c 'import plotly' 2>/dev/null && cudasnap campaign report numerics.sqlite --html "$OUT/numerics_report.html" -f > /dev/null 2>&1
cp numerics.sqlite "$OUT/"
python3 - logs/campaign.json logs/swap.json "$K" <<'PYEOF'
import json, sys
ok = True
swap = json.load(open(sys.argv[2]))
num = swap.get("numerics") or {}
close = (num.get("close_results") or [{}])[0]
print(f"replay with the -G stencil: exit {swap.get('exit_code')}, {num.get('exact')} EXACT, {num.get('close')} CLOSE, "
      f"{num.get('different')} DIFFERENT; {close.get('dtype')} from {close.get('dtype_source')}: {close.get('differing')} "
      f"of {close.get('elements')} elements differ, max abs {close.get('max_abs')}, max rel {close.get('max_rel')}, "
      f"max {close.get('max_ulp')} ULP; {(num.get('recheck') or {}).get('text', 'no recheck')}")
try:
    rep = json.load(open(sys.argv[1]))["report"]
except (OSError, ValueError, KeyError) as e:
    print(f"FAIL: no campaign result ({e})"); sys.exit(1)
m = {(row["snapshot"], env): c for row in rep["matrix"] for env, c in row["cells"].items()}
g = m.get(("stencil.cusnap", "G-stencil")) or {}
gn = g.get("numerics") or {}
print(f"G-stencil cell: {g.get('verdict')} {g.get('slower')}; numerics {gn}")
ok &= g.get("verdict") == "SLOWER" and gn.get("outcome") == "CLOSE"
others = [(v["snapshot"], v["env"], v["kernel"][:60], v["verdict"]) for v in rep.get("verdicts", [])
          if not (v["snapshot"] == "stencil.cusnap" and v["env"] == "G-stencil")]
eager = [o for o in others if o[1] == "eager-loading"]
rest = [o for o in others if o[1] != "eager-loading"]
print(f"other verdicts: {len(rest)} {rest[:8]}; eager-loading verdicts (listed apart): {eager[:8]}")
print(f"verdict counts: {rep.get('verdict_counts')}; controls {rep['controls']['verdicts']} of "
      f"{rep['controls']['comparisons']}; infra {len(rep['infra_failures'])}; exit {rep['exit_code']}")
ok &= not rest and not rep["infra_failures"]
json.dump({"swap_numerics": num, "g_cell": g, "other_verdicts": rest, "eager_verdicts": eager,
           "verdict_counts": rep.get("verdict_counts"), "exit_code": rep["exit_code"]},
          open("numerics_summary.json", "w"), indent=1, default=str)
print("PASS" if ok else "FAIL", ": the -G cell SLOWER with numerics CLOSE, no other verdict")
sys.exit(0 if ok else 1)
PYEOF
check $? "campaign: -G stencil SLOWER and CLOSE, 0 other verdicts"
cp numerics_summary.json "$OUT/" 2>/dev/null
tar czf "$OUT/numerics_logs.tgz" logs campaign.toml 2>/dev/null
ls -l "$OUT"
exit $FAIL
