#!/usr/bin/env bash
# Replay speed on the GPU machine: the training loop (native, plain replay,
# --profile timeline, CUDA graph), the launch loop and the big-snapshot row, side by side with
# native in one run, plus the replay tests that compare the C executor with the per-call path.
# Run from the project root (carry .whl):  bash bench/replay_speed_gpu.sh
# Env: REPS (default 3) native/replay pairs; STEPS (default 60) training steps.
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
cd /tmp
timeout ${BENCH_TIMEOUT:-540} python3 "$ROOT/bench/bench_replay_gpu.py" --reps "${REPS:-3}" --steps "${STEPS:-60}" \
  --json "$OUT/bench_replay.json" 2>&1 | tee "$OUT/replay_speed.log"
