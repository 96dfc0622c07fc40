#!/usr/bin/env bash
# The matrix's simulator column for every GPU-suite workload, in one GPU call (about 5 minutes on
# four H100s, 7 on two): bench/matrix_gpu.py with only the capture, timeline and sim cells
# (CUDASNAP_MATRIX_CELLS=timeline,sim): each workload of tests/gpu/matrix.py (JAX with
# --keep-ptx xla) captured, profiled once, and `info --sim --timeline` read for how many of its
# kernels, and how much of its GPU time, can run on the simulator, each n/a with its reason. No
# simulator is needed here. From the project root (carry .whl), on two or more GPUs (ddp_nccl needs two):
#   OUT=/tmp/out bash bench/sim_matrix_gpu.sh
# $OUT gets matrix_sim.txt (the table and the coverage per workload), matrix_sim.json (every cell)
# and, where a cell failed, matrix_sim.logs.tar.xz.
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
NGPU=$(nvidia-smi -L | wc -l)
# one GPU: two workloads at a time on it (their timelines still run alone)
SLOTS=${SLOTS:-$([ "$NGPU" -ge 2 ] && echo 2 || echo 3)}
CUDASNAP_MATRIX_CELLS=timeline,sim timeout ${LIMIT:-500} python3 "$ROOT/bench/matrix_gpu.py" --slots "$SLOTS" \
  --deadline ${DEADLINE:-400} --json "$OUT/matrix_sim.json" --work /tmp/cudasnap-matrix-sim 2>&1 | tee "$OUT/matrix_sim.txt"
echo "total $SECONDS s"
