#!/usr/bin/env bash
# The big-snapshot row on the GPU machine (bench/bench_bigsnap_gpu.py): ~6 GiB of device memory
# captured and replayed from the page cache, and the same snapshot replayed with the read-ahead
# off (CUDASNAP_PREFETCH=0: one reader, three pinned buffers) as the baseline, same machine.
# Run from the project root; results go to $OUT/bigsnap.json and $OUT/bigsnap.txt.
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp}
source "$ROOT/bench/gpu_env.sh"
python3 "$ROOT/bench/bench_bigsnap_gpu.py" --baseline --json "$OUT/bigsnap.json" ${BIGSNAP_ARGS:-} 2>&1 | tee "$OUT/bigsnap.txt"
