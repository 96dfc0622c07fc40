#!/usr/bin/env bash
# The one GPU-machine script: install from a wheel folder, build, run the GPU suite and the
# GPU benchmarks, write results under $OUT. Run from the project root on the GPU machine:
#   bash bench/gpu_suite.sh [pytest -k expression]        (carry .whl)
# Env: SKIP_BENCH=1 skips benchmarks; SKIP_SUITE=1 skips the pytest suite; SUITE_FILES: test
# paths under tests/ to run instead of the default (tests/gpu without the stress test and the
# matrix, which bench/matrix_gpu.py spreads over every GPU), e.g.
#   SUITE_FILES=gpu/test_gpu_stress.py SKIP_BENCH=1 SKIP_EXAMPLE=1 bash bench/gpu_suite.sh [-k expression]
# (CUDASNAP_STRESS_N: captures per workload, default 5; raise SUITE_TIMEOUT, 420 s by default, to
# fit the selection: the stress test prints its estimate first).
# GPUS="0 1 2 3": the suite's files spread over those GPUs, one pytest per entry at once, each
# with its own work folder and results file (gpu_results.sK.jsonl, K the entry's place); the
# whole suite took 325 s so on 4 H200s. A GPU may be named more than once ("0 0 0": three
# pytest processes share GPU 0; keep files with timing checks, such as the profile, advise and
# metrics tests, out of such a run); the selection file's two tests go to two entries (SPLIT).
# SLOTS=5 does that on one GPU: the other files over SLOTS pytest processes, then the timed files
# alone (SUITE_TIMEOUT applies to each part); SLOTS_PART=shared or timed runs one of the two
# parts (a suite split over two calls of one machine).
set -uo pipefail
ROOT=$(pwd); export CUDASNAP_ROOT=$ROOT
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import plotly" 2>/dev/null || echo "warning: plotly is not installed here: the --html checks (test_gpu_metrics) fail; carry plotly's and narwhals' wheels in .whl/" | tee "$OUT/warnings.txt"
export CUDASNAP_GPU_RESULTS=$OUT/gpu_results.jsonl CUDASNAP_GPU_WORK=/tmp/cudasnap-gpu
rm -f "$CUDASNAP_GPU_RESULTS"
# test from outside the tree, so the installed package is what gets imported
rm -rf /tmp/cs-tests && cp -r "$ROOT/tests" /tmp/cs-tests
cd /tmp
if [ -z "${SKIP_EXAMPLE:-}" ]; then
  bash "$ROOT/examples/run.sh" 2>&1 | tee "$OUT/example.log" | tail -6
  cp /tmp/cudasnap-example.cusnap "$OUT/example_vector_add.cusnap" 2>/dev/null
fi
if [ -z "${SKIP_SUITE:-}" ] && [ -n "${SLOTS:-}" ]; then
  # one GPU (GPU, default 0) shared by SLOTS pytest processes; the files with timing checks
  # (profile, advise, metrics) run after them, alone on it. Results under $OUT/shared, $OUT/alone.
  ALL=$(cd /tmp/cs-tests && ls ${SUITE_FILES:-gpu/test_gpu_*.py} | grep -v -E "test_gpu_(stress|matrix)")
  TIMED=$(echo "$ALL" | grep -E "test_gpu_(profile|advise|metrics)" | tr '\n' ' ')
  SHARED=$(echo "$ALL" | grep -v -E "test_gpu_(profile|advise|metrics)" | tr '\n' ' ')
  [ "${SLOTS_PART:-shared}" = timed ] && SHARED=
  [ "${SLOTS_PART:-timed}" = shared ] && TIMED=
  [ -n "$SHARED" ] && (cd "$ROOT" && OUT=$OUT/shared SUITE_FILES="$SHARED" SLOTS= SKIP_EXAMPLE=1 SKIP_BENCH=1 \
    GPUS=$(yes "${GPU:-0}" | head -n "$SLOTS" | tr '\n' ' ') bash bench/gpu_suite.sh "$@")
  [ -n "$TIMED" ] && (cd "$ROOT" && OUT=$OUT/alone SUITE_FILES="$TIMED" SLOTS= SKIP_EXAMPLE=1 SKIP_BENCH=1 \
    CUDA_VISIBLE_DEVICES=${GPU:-0} bash bench/gpu_suite.sh "$@")
  SKIP_SUITE=1
fi
if [ -z "${SKIP_SUITE:-}" ]; then
  if [ -n "${SUITE_FILES:-}" ]; then
    SUITE_PATHS=(); for f in $SUITE_FILES; do SUITE_PATHS+=("/tmp/cs-tests/$f"); done
  else
    # the stress test and the matrix have runners of their own (SUITE_FILES, bench/matrix_gpu.py)
    SUITE_PATHS=(/tmp/cs-tests/gpu --ignore=/tmp/cs-tests/gpu/test_gpu_stress.py --ignore=/tmp/cs-tests/gpu/test_gpu_matrix.py)
  fi
  if [ -n "${GPUS:-}" ]; then
    # files to GPUs, heaviest first onto the least loaded (seconds each, one H200 shared by 5
    # pytest processes); a file of SPLIT (default: selection) goes out test function by test
    # function (pytest node ids), each with its share of the file's cost
    mapfile -t GROUPS_ < <(python3 - "${SUITE_PATHS[@]}" <<'PY'
import glob, os, re, sys
cost = {"profile": 300, "capture": 150, "replay": 60, "executor": 40, "selection": 130, "metrics": 30,
        "samples": 35, "ipc": 20, "wrap": 20, "advise": 40, "endstate": 15, "memops": 10, "texture": 10, "staging": 5}
split = set(os.environ.get("SPLIT", "selection").split())
def part(f):
    return os.path.basename(f).split("::")[0][9:-3]
args, skip, files = sys.argv[1:], set(), []
for i, a in enumerate(args):
    if a.startswith("--ignore="):
        skip.add(a.split("=", 1)[1])
for a in args:
    if a.startswith("--"):
        continue
    files += sorted(glob.glob(os.path.join(a, "test_gpu_*.py"))) if os.path.isdir(a) else [a]
files = [f for f in files if f not in skip]
n = len(os.environ["GPUS"].split())
share = {}
if n > 1:
    for f in [f for f in files if part(f) in split and "::" not in f]:
        tests = re.findall(r"^def (test_\w+)", open(f).read(), re.M)
        if len(tests) > 1:
            files.remove(f)
            for t in tests:
                files.append(f"{f}::{t}")
                share[f"{f}::{t}"] = cost.get(part(f), 30) / len(tests)
weight = lambda f: share.get(f, cost.get(part(f), 30))
groups, load = [[] for _ in range(n)], [0] * n
for f in sorted(files, key=lambda f: -weight(f)):
    k = load.index(min(load))
    groups[k].append(f)
    load[k] += weight(f)
print("\n".join(" ".join(g) for g in groups))
PY
)
    i=0; rm -f "$OUT/gpu_suite.log"
    for g in $GPUS; do
      files=${GROUPS_[$i]:-}; k=$i; i=$((i + 1))
      [ -z "$files" ] && continue
      ( CUDA_VISIBLE_DEVICES=$g CUDASNAP_GPU_WORK=/tmp/cudasnap-gpu.s$k CUDASNAP_GPU_RESULTS=$OUT/gpu_results.s$k.jsonl \
        timeout ${SUITE_TIMEOUT:-420} python3 -m pytest -m gpu -p no:cacheprovider -q -rA ${1:+-k "$1"} $files \
        > "$OUT/gpu_suite.s$k.log" 2>&1; echo "slot $k (GPU $g): exit $? ($files)" >> "$OUT/gpu_suite.log" ) &
    done
    wait
    cat "$OUT/gpu_suite.log"; for k in $(seq 0 $((i - 1))); do tail -3 "$OUT/gpu_suite.s$k.log" 2>/dev/null; done
  else
    timeout ${SUITE_TIMEOUT:-420} python3 -m pytest -m gpu -p no:cacheprovider -q -rA ${1:+-k "$1"} "${SUITE_PATHS[@]}" 2>&1 | tee "$OUT/gpu_suite.log" | tail -40
  fi
  cp /tmp/cudasnap-gpu/snaps/nvcc_ptrs.cusnap "$OUT/example_ptrs.cusnap" 2>/dev/null
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 "$ROOT/bench/bench_capture_gpu.py" --json "$OUT/bench_capture.json" 2>&1 | tee "$OUT/bench.log" | tail -8
  timeout ${BENCH_TIMEOUT:-300} python3 "$ROOT/bench/bench_replay_gpu.py" --json "$OUT/bench_replay.json" 2>&1 | tee -a "$OUT/bench.log" | tail -8
fi
