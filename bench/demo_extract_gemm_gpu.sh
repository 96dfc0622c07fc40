#!/usr/bin/env bash
# GPU demonstration of `cudasnap extract --kernel` on GEMMs of a PyTorch training loop
# (bench/demo_torch_train.py: Linear+ReLU layers, AdamW), --ranges exact against segment:
#   A. the default loop (8 layers, width 1024): three GEMMs (steps 0, 1 and 2), each extracted
#      with --ranges exact --check and with --ranges segment; sizes and verification printed;
#   B. the same loop with 48 layers: one GEMM extracted must be < 5% of the snapshot, replay
#      verified (--check) and the extract exported to C, built with gcc and run verified.
# An exact extract is about what its GEMM touches (a 4 MiB weight, 1 MiB activations here), so
# its share of the snapshot falls as the model grows: A reports it, B checks the goal.
# Run from the project root on the GPU machine (with .whl holding the wheels the image lacks):
#   bash bench/demo_extract_gemm_gpu.sh   (writes $OUT/demo_extract_gemm.log, ..._summary.txt)
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-extract-gemm; rm -rf "$W"; mkdir -p "$W"
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
cd "$W"
SUM=$OUT/demo_extract_gemm_summary.txt; : > "$SUM"
exec > >(tee "$OUT/demo_extract_gemm.log") 2>&1
check() { local ok=FAIL; [ "$2" = "$3" ] && ok=PASS; echo "$ok  $1 (exit $3, expected $2)${4:+  $4}" | tee -a "$SUM"; }
info() { echo "INFO  $*" | tee -a "$SUM"; }
ratio() { python3 -c "import os; print(f'{100 * os.path.getsize(\"$1\") / os.path.getsize(\"$2\"):.2f}%')" 2>/dev/null || echo "-"; }
ext() {  # ext NAME ARGS...: extract, show its summary, keep the restored-bytes line in the summary
  local name=$1; shift
  cudasnap extract "$@" > "$name.txt" 2>&1; local rc=$?
  cat "$name.txt"; info "$name: $(grep -h 'restored bytes' "$name.txt" | sed 's/^ *//')"
  return $rc
}
GEMM='gemm|Gemm|nvjet'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== A. 8 layers x 1024, 3 steps"
cudasnap capture -f -o train.cusnap -- python3 "$ROOT/bench/demo_torch_train.py" 3 | tail -4
check "capture of the training loop" 0 ${PIPESTATUS[0]} "$(stat -c %s train.cusnap) bytes"
count() {  # count SNAPSHOT: GEMM launches in it (extract names how many match when asked for too many)
  cudasnap extract "$1" --kernel "$GEMM#1000000" -f -o count.cusnap 2>&1 | sed -n 's/.*(\([0-9]*\) found).*/\1/p'
}
n=$(count train.cusnap); n=${n:-0}
info "GEMM launches in the snapshot: $n"
[ "$n" -gt 0 ]; check "GEMM launches found (regex $GEMM)" 0 $?
[ "$n" -gt 0 ] && for k in 1 $(( n / 3 + 1 )) $(( 2 * n / 3 + 1 )); do
  ext "g$k" train.cusnap --kernel "$GEMM#$k" -o "g$k.cusnap" --check
  check "GEMM #$k: extract --ranges exact --check (replay verifies)" 0 $? "$(ratio g$k.cusnap train.cusnap) of the snapshot"
  ext "g${k}s" train.cusnap --kernel "$GEMM#$k" -o "g${k}s.cusnap" --ranges segment --check
  check "GEMM #$k: extract --ranges segment --check" 0 $? "$(ratio g${k}s.cusnap train.cusnap) of the snapshot"
done

echo "== B. 48 layers x 1024, 2 steps"
cudasnap capture -f -o deep.cusnap -- python3 "$ROOT/bench/demo_torch_train.py" 2 1024 48 | tail -3
check "capture of the 48-layer training loop" 0 ${PIPESTATUS[0]} "$(stat -c %s deep.cusnap) bytes"
n=$(count deep.cusnap); k=$(( ${n:-0} / 2 + 1 ))
ext deep_gemm deep.cusnap --kernel "$GEMM#$k" -o deep_gemm.cusnap --check
check "48 layers: extract of GEMM #$k verifies on replay" 0 $?
orig=$(stat -c %s deep.cusnap); small=$(stat -c %s deep_gemm.cusnap)
python3 -c "import sys; sys.exit(0 if $small < 0.05 * $orig else 1)"
check "48 layers: extracted GEMM < 5% of the snapshot" 0 $? "$small of $orig bytes = $(ratio deep_gemm.cusnap deep.cusnap)"
cudasnap export deep_gemm.cusnap -o gemm_c && make -s -C gemm_c CC=gcc CUDA_HOME="$CUDA_HOME" > make.log 2>&1
check "export + gcc build of the extracted GEMM" 0 $?
./gemm_c/replay | tail -3; check "exported GEMM program runs and verifies" 0 ${PIPESTATUS[0]}
