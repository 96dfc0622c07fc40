#!/usr/bin/env bash
# The main job: capture the bundled example and replay it, verified. Without an NVIDIA GPU,
# say so and show `cudasnap info` of the real snapshot shipped here instead.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
command -v cudasnap > /dev/null 2>&1 || cudasnap() { python3 -m cudasnap "$@"; }
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
  OUT=${TMPDIR:-/tmp}/cudasnap-example.cusnap
  cudasnap capture -f -o "$OUT" -- python3 "$HERE/vector_add.py" || exit $?
  cudasnap info "$OUT"
  cudasnap replay "$OUT"
else
  echo "No NVIDIA GPU found on this machine: capture and replay need one."
  echo "Showing the snapshot captured on an H200 that ships in examples/ instead:"
  echo
  cudasnap info "$HERE/nvcc_ptrs_h200.cusnap"
fi
