#!/usr/bin/env bash
# `cudasnap replay --profile metrics` side by side with Nsight Compute on three programs: an nvcc
# program (a memory-bound triad and a compute-bound FMA kernel), a PyTorch training step (an MLP
# with AdamW, bench/demo_torch_train.py) and a cuBLAS-heavy fp16 inference
# (tests/gpu/workloads/metrics_infer.py). Per program: capture, replay with the SpeedOfLight and
# Occupancy sections, ncu twice with the same metrics (clocks unlocked, caches flushed, as the
# replay runs), and a table of per-kernel medians for kernels of >= 20 us: cudasnap, ncu run 1,
# ncu run 2, the difference and the limit (5% of ncu's mean, or ncu's own spread when larger;
# tests/gpu/metrics_vs_ncu.py). Rows also go to $OUT/metrics_vs_ncu.jsonl.
# Run from the project root on the GPU machine: bash bench/metrics_vs_ncu_gpu.sh
# (TORCH_LAUNCHES, INFER_LAUNCHES: how many launches of the two PyTorch programs, 400 and 200;
# NCU_EXTRA: more ncu options, e.g. "--replay-mode application"; ONLY: one program's name)
# Exit 0: every compared figure agrees; 1: some do not; 2: a program could not be compared.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/bench/gpu_env.sh"
OUT=${OUT:-/tmp/cudasnap-metrics}
mkdir -p "$OUT"
command -v ncu >/dev/null || { echo "ncu is not on PATH"; exit 2; }
nvcc -O3 -arch=sm_90 -o "$OUT/metrics_kernels" "$ROOT/tests/gpu/workloads/metrics_kernels.cu" || exit 2
export CUBLAS_WORKSPACE_CONFIG=:4096:8
rc=0
run() {
  local name=$1; shift
  python3 "$ROOT/tests/gpu/metrics_vs_ncu.py" --name "$name" --json "$OUT/metrics_vs_ncu.jsonl" \
    --work "$OUT/work" "$@"
  local r=$?
  [ $r -gt $rc ] && rc=$r
  echo "($name: exit $r)"
}
want() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
want nvcc_triad_fma && run nvcc_triad_fma -- "$OUT/metrics_kernels"
want torch_train_step && run torch_train_step -c ${TORCH_LAUNCHES:-400} -- python3 "$ROOT/bench/demo_torch_train.py" 2 1024 8
want cublas_inference && run cublas_inference -c ${INFER_LAUNCHES:-200} -- python3 "$ROOT/tests/gpu/workloads/metrics_infer.py"
echo
echo "metrics_vs_ncu: exit $rc (rows in $OUT/metrics_vs_ncu.jsonl)"
exit $rc
