#!/usr/bin/env bash
# GPU demonstration of `cudasnap campaign` on a 4-GPU machine (Ray unpacked into /tmp/site):
#   1. builds bench/demo_ab.cu and a -G cubin of it (compute_k, slower, same results), and the
#      nvcc workloads ptrs.cu and mt_launch.cu;
#   2. captures 10 real programs, 4 at a time, one per GPU: demo_ab, ptrs, mt_launch (nvcc),
#      PyTorch inference (demo_torch_mlp.py, torch_eager.py) and training (demo_torch_train.py),
#      JAX (jax_jit.py, jax_train.py), CuPy with its libraries (cupy_libs.py), Triton
#      (triton_kernel.py), CUDA graphs (torch_graph.py) and torch.compile (torch_compile.py);
#   3. writes a campaign: those snapshots (nvcc ones isolated, framework ones timeline) x four
#      environments: plain (the baseline), a no-op control (control = true), eager module loading
#      (CUDA_MODULE_LOADING=EAGER) and the -G build of compute_k swapped in (CUDASNAP_REPLACE; the
#      other snapshots do not record compute_k, so there the environment is plain);
#   4. (after the first captures) side by side on GPU 0, the nvcc snapshots x 2 envs with [rules]
#      workers = "fresh" (a process per replay), "warm" (forked by a server per GPU and env) and
#      "kept" (one process replaying one snapshot after another; SIDE_WORKERS picks): the fixed cost
#      per cell and the verdicts; stops the script when any fails;
#   5. runs the campaign on 1 GPU (CUDA_VISIBLE_DEVICES=0), then RUNS4 times (default 3) on 4
#      (fewer where the machine has fewer), each a new run (--fresh) of one store;
#   6. checks every 4-GPU run: exit 1, compute_k in demo_ab under the -G swap found and attributed
#      to the rebuilt kernel, no verdict in the control nor where the swap changes nothing, no
#      infrastructure failure; eager-loading verdicts count as findings only when every run
#      (the 1-GPU one too) gives the same kernels the same way, else as false verdicts; 4 GPUs
#      >= 3.6x faster than 1 on the cells (0.9x per GPU on fewer); prints cells per hour per GPU,
#      the fixed cost per cell and per replay, and where each replay's time went;
#   7. (BISECT=1) bisects 8 environments of demo_ab with --gpus 1 and --gpus 4.
# PHASES_ONLY=1 (with SIDE=0): after the captures, each snapshot replayed 3 times in one kept
# process (bench/bench_kept.py, its campaign profile mode): run.timings_s per replay and the mean
# of replays 2-3 (where torch.compile's replay goes); then stop (one GPU is enough, ~6-8 min).
# Writes under $OUT: campaign.log, campaign.toml, campaign.html, summary.json and results.tgz (each
# run's JSON, the report's, the stores and the logs). Run from the project root:
#   bash bench/campaign_gpu.sh
# Env: REPEAT (isolated repeats, default 5), ARCH (default sm_90), THRESHOLD (percent, default 10),
# RUNS4 (default 3), BISECT (default 0), SIDE (default 1: step 4), SIDE_WORKERS (default "fresh
# warm kept"), WORKERS (the campaign's [rules] workers, default the campaign's), PHASE (1 | 2 |
# all: a run split in two calls of one machine, at RUN4_SPLIT, default 1).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-campaign
# PHASE=1: steps 1-5, 4-GPU runs 1..RUN4_SPLIT; PHASE=2 (later, same machine): the remaining runs and
# step 6 on the snapshots and stores phase 1 left; unset: everything
PHASE=${PHASE:-all}; RUN4_SPLIT=${RUN4_SPLIT:-1}
# where each program's replays spent their time, as the campaign measured it (run JSON's cost)
phases() {
  python3 -c 'import json, sys
from cudasnap.campaign.run import phase_lines
try:
    print("\n".join(phase_lines((json.load(open(sys.argv[1])).get("cost") or {}).get("phases_by_snapshot") or {})))
except (OSError, ValueError) as e:
    print("no phases:", e)' "$1"
}
[ "$PHASE" = 2 ] || { rm -rf "$W"; mkdir -p "$W/snaps" "$W/logs" "$W/json"; }
RES=$W/json      # each run's JSON, kept on the machine across the two phases, copied to $OUT
REPEAT=${REPEAT:-5}; ARCH=${ARCH:-sm_90}; THRESHOLD=${THRESHOLD:-10}; RUNS4=${RUNS4:-3}; BISECT=${BISECT:-0}
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
. "$ROOT/bench/demo_lib.sh"
exec > >(tee -a "$OUT/campaign.log") 2>&1
python3 -c 'import ray' || { echo "Ray is not importable: unpack it into /tmp/site"; exit 2; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
NG=$(nvidia-smi -L | wc -l)
[ "$NG" -ge 4 ] || echo "note: $NG GPU(s); the 4-GPU run uses what there is"
NK=$(( NG < 4 ? NG : 4 )); VIS=$(seq -s, 0 $(( NK - 1 )))
g() { echo $(( $1 % NK )); }   # capture slot -> a GPU that exists
export CUBLAS_WORKSPACE_CONFIG=:4096:8 XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=--xla_gpu_deterministic_ops=true
WL=$ROOT/tests/gpu/workloads
cd "$W"

if [ "$PHASE" != 2 ]; then
step "1. build ($ARCH)"
T0=$(date +%s)
nvcc -O3 -arch=$ARCH -o demo_ab "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -G -cubin -arch=$ARCH -o slow_G.cubin "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -O2 -cudart static -arch=$ARCH -o ptrs "$WL/ptrs.cu" || exit 2
nvcc -O2 -std=c++17 -cudart static -arch=$ARCH -o mt_launch "$WL/mt_launch.cu" -lpthread || exit 2

step "2. capture 12 programs, one per GPU at a time"
cap() {  # cap NAME GPU CMD...
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu cudasnap capture -q -o "snaps/$name.cusnap" -- "$@" > "logs/$name.log" 2>&1
  echo "$name: capture exit $? ($(du -h "snaps/$name.cusnap" 2>/dev/null | cut -f1))"
}
PY=python3
# wait for the captures by pid: a bare `wait` also waits for the tee of the log (a process
# substitution, bash >= 5.1), which ends only with the script
pids=()
cap demo_ab 0 ./demo_ab 4194304 8 & pids+=($!); cap ptrs $(g 1) ./ptrs & pids+=($!)
cap mt_launch $(g 2) ./mt_launch 4 8 & pids+=($!)
cap torch_mlp_infer $(g 3) $PY "$ROOT/bench/demo_torch_mlp.py" 16 2048 & pids+=($!)
wait "${pids[@]}"; pids=()
if [ "${SIDE:-1}" = 1 ]; then
step "2b. workers side by side on GPU 0 (${SIDE_WORKERS:-fresh warm kept}; the nvcc snapshots x 2 envs)"
for w in ${SIDE_WORKERS:-fresh warm kept}; do
  printf 'name = "side"\nbaseline = "plain"\n[rules]\nrepeats = %s\nwarmup = 2\nthreshold = %s\nmax_reruns = 1\ntimeout = 240\nretries = 1\nworkers = "%s"\n' $REPEAT $THRESHOLD $w > side_$w.toml
  printf '[[snapshot]]\npath = "snaps/demo_ab.cusnap"\n[[snapshot]]\npath = "snaps/ptrs.cusnap"\n[[snapshot]]\npath = "snaps/mt_launch.cusnap"\n[[env]]\nname = "plain"\n[[env]]\nname = "control"\ncontrol = true\nvars = { CUDASNAP_CAMPAIGN_NOTHING = "1" }\n' >> side_$w.toml
  CUDA_VISIBLE_DEVICES=0 cudasnap campaign run side_$w.toml -o side_$w.sqlite --json > "$RES/side_$w.json" 2> logs/side_$w.err
  rc=$?; echo "workers=$w: exit $rc"; tail -2 logs/side_$w.err
  phases "$RES/side_$w.json"
  [ $rc -le 1 ] || { echo "FAIL: the side-by-side campaign with workers=$w exited $rc"; exit 2; }
done
python3 - "$RES" ${SIDE_WORKERS:-fresh warm kept} <<'PYEOF'
import json, sys
runs = {w: json.load(open(f"{sys.argv[1]}/side_{w}.json")) for w in sys.argv[2:]}
first = next(iter(runs.values()))
for w, r in runs.items():
    c = r["cost"]
    verdicts = [v for v in r["report"].get("verdicts", []) if v.get("verdict") in ("SLOWER", "FASTER")]
    print(f"workers={w}: fixed cost {c['fixed_s_per_cell']:.3f} s per cell ({first['cost']['fixed_s_per_cell'] / c['fixed_s_per_cell']:.2f}x "
          f"less than {next(iter(runs))}; {c.get('fixed_s_per_cell_started')} once the servers are up), "
          f"{c['fixed_s_per_replay']:.3f} s per replay, {c['replays']} replays; cells "
          f"{r['cells_wall_s']} s; verdicts other than SAME: {len(verdicts)}")
PYEOF
fi

cap torch_eager 0 $PY "$WL/torch_eager.py" & pids+=($!)
cap torch_train $(g 1) $PY "$ROOT/bench/demo_torch_train.py" 4 1024 4 & pids+=($!)
cap jax_jit $(g 2) $PY "$WL/jax_jit.py" & pids+=($!); cap cupy_libs $(g 3) $PY "$WL/cupy_libs.py" & pids+=($!)
wait "${pids[@]}"
pids=(); cap jax_train 0 $PY "$WL/jax_train.py" & pids+=($!); cap triton_kernel $(g 1) $PY "$WL/triton_kernel.py" & pids+=($!)
# CUDA graphs (torch.cuda.graph) and torch.compile (Inductor's Triton kernels)
cap torch_graph $(g 2) $PY "$WL/torch_graph.py" & pids+=($!); cap torch_compile $(g 3) $PY "$WL/torch_compile.py" & pids+=($!)
wait "${pids[@]}"
ls snaps/*.cusnap | wc -l | xargs echo "snapshots:"
echo "build + captures: $(( $(date +%s) - T0 )) s"
if [ "${PHASES_ONLY:-0}" = 1 ]; then
  step "2c. where each program's replays go: 3 replays in one kept process each (bench_kept.py), GPU 0"
  for s in snaps/*.cusnap; do
    case $(basename "$s") in demo_ab*|ptrs*|mt_launch*) m=isolated ;; *) m=timeline ;; esac
    echo "== $(basename "$s") ($m)"
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 "$ROOT/bench/bench_kept.py" --snapshot "$s" --mode $m --replays 3 \
      --repeat $REPEAT --json "$RES/phases_$(basename "$s" .cusnap).json" 2> "logs/phases_$(basename "$s").err" \
      || { echo "exit $?"; tail -3 "logs/phases_$(basename "$s").err"; }
  done
  tar czf "$OUT/results.tgz" -C "$W" json logs; ls -l "$OUT"; exit $FAIL
fi

step "3. the campaign"
cat > campaign.toml <<EOF
name = "gpu-demo"
baseline = "plain"

[rules]
repeats = $REPEAT
warmup = 2
threshold = $THRESHOLD
noise_factor = 2.0
max_reruns = 1
confirm = true
timeout = 240
retries = 1
${WORKERS:+workers = \"$WORKERS\"}

[[snapshot]]
path = "snaps/demo_ab.cusnap"
[[snapshot]]
path = "snaps/ptrs.cusnap"
[[snapshot]]
path = "snaps/mt_launch.cusnap"
[[snapshot]]
path = "snaps/torch_*.cusnap"
profile = "timeline"
[[snapshot]]
path = "snaps/jax_*.cusnap"
profile = "timeline"
[[snapshot]]
path = "snaps/cupy_*.cusnap"
profile = "timeline"
[[snapshot]]
path = "snaps/triton_*.cusnap"
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
name = "G-swap"
vars = { CUDASNAP_REPLACE = "compute_k=$W/slow_G.cubin" }
EOF
cp campaign.toml "$OUT/"

step "5a. on 1 GPU"
T=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=0 cudasnap campaign run campaign.toml -o one.sqlite --json > "$RES/run1.json" 2> logs/run1.err
RC1=$?; T1=$(python3 -c "import time; print(round(time.time() - $T, 1))")
echo "1 GPU: exit $RC1, ${T1} s"; tail -3 logs/run1.err
phases "$RES/run1.json"
cp one.sqlite four.sqlite
fi
FROM=1; TO=$RUNS4
[ "$PHASE" = 1 ] && TO=$RUN4_SPLIT
[ "$PHASE" = 2 ] && FROM=$(( RUN4_SPLIT + 1 ))
for r in $(seq $FROM $TO); do
  step "5b. on $NK GPUs, run $r of $RUNS4"
  T=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$VIS cudasnap campaign run campaign.toml -o four.sqlite --fresh --json > "$RES/run4_$r.json" 2> logs/run4_$r.err
  rc=$?; t=$(python3 -c "import time; print(round(time.time() - $T, 1))")
  echo "$NK GPUs run $r: exit $rc, ${t} s"; tail -3 logs/run4_$r.err
  phases "$RES/run4_$r.json"
done

[ "$PHASE" = 1 ] && { tar czf "$OUT/results.tgz" -C "$W" json logs; ls -l "$OUT"; exit $FAIL; }
step "6. report and checks"
HTML=; python3 -c 'import plotly' 2>/dev/null && HTML="--html $OUT/campaign.html -f"
cudasnap campaign report four.sqlite $HTML; echo "report exit $?"
python3 - "$RES" "$NK" "$RUNS4" one.sqlite four.sqlite <<'PYEOF'
import json, sqlite3, sys
out, nk, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r1 = json.load(open(f"{out}/run1.json"))
r4 = [json.load(open(f"{out}/run4_{i}.json")) for i in range(1, runs + 1)]
ok = True


def verdicts(r):
    """(snapshot, env, kernel, verdict) of every kernel verdict of a run."""
    return {(v["snapshot"], v["env"], v["kernel"], v["verdict"]) for v in r["report"].get("verdicts", [])}


def is_g(v):
    return v[0] == "demo_ab.cusnap" and v[1] == "G-swap" and v[2] == "compute_k" and v[3] == "SLOWER"


eager_all = [{v for v in verdicts(r) if v[1] == "eager-loading"} for r in [r1] + r4]
eager_stable = set.intersection(*eager_all) if eager_all else set()
false_total = 0
for i, r in enumerate(r4, 1):
    rep = r["report"]
    vs = verdicts(r)
    g = [v for v in vs if is_g(v)]
    regs = [x for x in rep["regressions"] if x["snapshot"] == "demo_ab.cusnap" and x["env"] == "G-swap"
            and x["kernel"] == "compute_k"]
    attributed = bool(regs) and any(d["dimension"] == "rebuilt kernel" and d["what"] == "compute_k"
                                    for d in regs[0]["differences"])
    false = [v for v in vs if not is_g(v) and not (v[1] == "eager-loading" and v in eager_stable)]
    false_total += len(false)
    print(f"run {i}: exit {rep['exit_code']}, -G found {bool(g)}, attributed {attributed}, "
          f"controls {rep['controls']['verdicts']} of {rep['controls']['comparisons']}, "
          f"eager findings {len([v for v in vs if v in eager_stable])}, false verdicts {len(false)} {sorted(false)[:6]}, "
          f"infra {len(rep['infra_failures'])}, cells {r['cells_wall_s']} s, cost {r.get('cost')}")
    ok &= rep["exit_code"] == 1 and bool(g) and attributed and not false and not rep["infra_failures"]
print("eager-loading findings in every run (1 GPU and each 4-GPU run):",
      sorted((v[0], v[2][:50], v[3]) for v in eager_stable))
print("PASS" if false_total == 0 else "FAIL", f": {false_total} false verdict(s) in {runs} runs on {nk} GPUs")
c1 = r1["cells_wall_s"]
c4 = sum(r["cells_wall_s"] for r in r4) / len(r4)
need = 0.9 * nk
print("PASS" if c1 >= need * c4 else "FAIL", f": cells on {nk} GPUs {c1 / c4:.2f}x faster than on 1 (mean of {runs}), "
      f"{need:g}x asked ({c1} s vs {c4:.1f} s, Ray start excluded)")
summ = {"cells_1gpu_s": c1, "cells_4gpu_s": [r["cells_wall_s"] for r in r4], "speedup": round(c1 / c4, 2),
        "false_verdicts": false_total, "eager_findings": sorted(map(list, eager_stable))}
for name, r, k in [("1gpu", r1, 1)] + [(f"{nk}gpu_run{i}", x, nk) for i, x in enumerate(r4, 1)]:
    cells = r["ran"]
    summ[name] = {"cells": cells, "cells_per_hour": round(cells / r["cells_wall_s"] * 3600),
                  "cells_per_hour_per_gpu": round(cells / r["cells_wall_s"] * 3600 / k), "cost": r.get("cost")}
    print(name, summ[name])
# where each replay's time went, per program: the campaign's own means of run.timings_s (cost
# phases_by_snapshot) of the last run, printed as the campaign prints them
from cudasnap.campaign.run import phase_lines
last = r4[-1] if r4 else r1
summ["replay_phases_mean_s"] = (last.get("cost") or {}).get("phases_by_snapshot") or {}
print("\n".join(phase_lines(summ["replay_phases_mean_s"])) or "no replay phases in the run's cost")
json.dump(summ, open(f"{out}/summary.json", "w"), indent=1)     # out: the runs' JSON folder
sys.exit(0 if ok and false_total == 0 and c1 >= need * c4 else 1)
PYEOF
check $? "campaign checks"
cp "$RES/summary.json" "$OUT"/
cudasnap campaign report four.sqlite --json > "$RES/report.json"
# few files come back from some machines: one archive with the runs' JSON, the stores and the logs
tar czf "$OUT/results.tgz" json logs one.sqlite four.sqlite side_*.sqlite campaign.toml 2>/dev/null
if [ "$BISECT" != 1 ]; then
  ls -l "$OUT"
  exit $FAIL
fi

step "7. bisect on 1 GPU and on $NK: 8 nightly environments of demo_ab, the -G swap from the 6th"
for i in 1 2 3 4 5 6 7 8; do
  printf '[[env]]\nname = "night%d"\nvars = { CUDASNAP_NIGHT = "%d"%s }\n' $i $i \
    "$([ $i -ge 6 ] && echo ", CUDASNAP_REPLACE = \"compute_k=$W/slow_G.cubin\"")"
done > bisect.toml
for k in 1 $NK; do
  T=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$([ $k = 1 ] && echo 0 || echo $VIS) cudasnap bisect snaps/demo_ab.cusnap --envs bisect.toml \
    --repeat 5 --warmup 2 --threshold 10 --gpus $k --json > "bisect$k.json" 2> "logs/bisect$k.err"
  rc=$?; t=$(python3 -c "import time; print(round(time.time() - $T, 1))")
  python3 - "bisect$k.json" $rc $t $k <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); fb = (r.get("first_bad") or {}).get("name")
print(f"bisect on {sys.argv[4]} GPU(s): exit {sys.argv[2]}, first bad {fb}, {r['replays']} replays in "
      f"{r.get('rounds')} rounds, {sys.argv[3]} s (Ray's start included)")
print("PASS" if sys.argv[2] == "1" and fb == "night6" else "FAIL", ": bisect finds night6")
PY
  [ $? = 0 ] || FAIL=1
done
cp bisect.toml logs/

T=$(date +%s.%N); python3 -c "import subprocess,sys; subprocess.run([sys.executable,'-m','cudasnap','--version'])"
echo "process start (python -m cudasnap --version): $(python3 -c "import time; print(round(time.time() - $T, 2))") s"
tar czf "$OUT/stores.tar.gz" one.sqlite four.sqlite campaign.toml bisect*.json logs 2>/dev/null
ls -l "$OUT"
exit $FAIL
