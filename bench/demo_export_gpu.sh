#!/usr/bin/env bash
# Take it anywhere, on the GPU machine: export, extract and re-targeting, end to end.
#   1. export: an nvcc program's snapshot -> a standalone C program built with gcc against the
#      real libcuda; it runs and verifies (exit 0); one corrupted expected result -> exit 1
#   2. extract: one GEMM of a PyTorch snapshot -> a small snapshot that replays verified, and
#      that small snapshot exported as a C program too; the whole PyTorch snapshot exported
#   3. replay --jit ptx: an nvcc program built with SASS and PTX, replayed from its PTX
#   4. replay's preflight: a program built with PTX only is reported as JIT and verifies; a
#      snapshot whose module has SASS for sm_80 only (no sm_90, no PTX: as if captured on an
#      A100) is refused before anything runs
# Run from the project root (install as gpu_suite.sh does; carry .whl): bash bench/demo_export_gpu.sh
# Writes $OUT/demo.log (everything) and $OUT/demo_summary.txt (one line per check).
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/demo_install.log . "$ROOT/bench/gpu_env.sh"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
W=/tmp/cudasnap-demo; rm -rf $W; mkdir -p $W; cd $W
SUM=$OUT/demo_summary.txt; : > "$SUM"
exec > >(tee -a "$OUT/demo.log") 2>&1
step() { echo; echo "== $*"; }
check() {  # check NAME EXPECTED_RC ACTUAL_RC [detail]
  local ok=FAIL; [ "$2" = "$3" ] && ok=PASS
  echo "$ok  $1 (exit $3, expected $2)${4:+  $4}" | tee -a "$SUM"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "CUDA_HOME=$CUDA_HOME  gcc: $(gcc --version | head -1)"

step "1. export an nvcc program's snapshot; build with gcc against the real libcuda"
nvcc -O2 -cudart static -arch=sm_90 -o ptrs "$ROOT/tests/gpu/workloads/ptrs.cu"
cudasnap capture -o ptrs.cusnap -- ./ptrs | tail -2
cudasnap export ptrs.cusnap -o ptrs_c; check "export nvcc snapshot" 0 $?
make -C ptrs_c CC=gcc CUDA_HOME="$CUDA_HOME"; check "gcc build of the exported program" 0 $?
./ptrs_c/replay; check "exported program runs and verifies" 0 $?
d2h=$(ls ptrs_c/data/d2h-*.bin | head -1)
python3 - "$d2h" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[0] ^= 1; open(p, "wb").write(bytes(b))
EOF
./ptrs_c/replay; check "exported program with one corrupted expected result" 1 $?
cp ptrs_c/replay.c "$OUT/demo_ptrs_replay.c"
# fill() guards i < n: a larger grid gives the same results, which replay verifies
cudasnap replay ptrs.cusnap --launch-override 'grid=256,1,1,kernel=fill' | tail -3
check "replay --launch-override grid=256 on fill()" 0 ${PIPESTATUS[0]}

step "2. extract one GEMM from a PyTorch snapshot"
cudasnap capture -o mlp.cusnap -- python3 "$ROOT/bench/demo_torch_mlp.py" 48 2048 | tail -3
cudasnap info mlp.cusnap | grep -i -A12 "kernel"
cudasnap extract mlp.cusnap --kernel 'gemm|Gemm' -o gemm.cusnap | tee extract.txt; check "extract --kernel gemm" 0 ${PIPESTATUS[0]}
orig=$(stat -c %s mlp.cusnap); small=$(stat -c %s gemm.cusnap)
pct=$(python3 -c "print(f'{100*$small/$orig:.2f}')")
python3 -c "import sys; sys.exit(0 if $small < 0.05 * $orig else 1)"; check "extract is < 5% of the original" 0 $? "$small of $orig bytes = $pct%"
cudasnap replay gemm.cusnap; rc=$?; check "replay of the extracted GEMM verifies" 0 $rc
[ $rc = 0 ] || cudasnap dump gemm.cusnap | grep -v "^\[b\]" | tail -40
cudasnap export gemm.cusnap -o gemm_c && make -s -C gemm_c CC=gcc CUDA_HOME="$CUDA_HOME" && ./gemm_c/replay
check "extracted GEMM as a standalone C program" 0 $?

step "2b. the whole PyTorch snapshot as a standalone C program"
cudasnap export mlp.cusnap -o mlp_c && make -s -C mlp_c CC=gcc CUDA_HOME="$CUDA_HOME" && ./mlp_c/replay
check "PyTorch snapshot exported, built with gcc, run" 0 $?

step "3. replay --jit ptx: an nvcc program built with SASS and PTX"
if cudasnap replay --help | grep -q -- "--jit"; then
  nvcc -O2 -cudart static -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
       -o ptrs_ptx "$ROOT/tests/gpu/workloads/ptrs.cu"
  cudasnap capture -o ptrs_ptx.cusnap -- ./ptrs_ptx | tail -1
  cudasnap info ptrs_ptx.cusnap | grep -i -A3 "module"
  cudasnap replay ptrs_ptx.cusnap --jit ptx; check "replay --jit ptx" 0 $?
else
  echo "replay has no --jit option in this build"; check "replay --jit ptx (not built)" 0 1
fi

step "4. preflight: modules without SASS for this GPU"
if cudasnap replay --help | grep -q -- "--jit"; then
  nvcc -O2 -cudart static -gencode arch=compute_80,code=compute_80 -o ptrs_ptxonly "$ROOT/tests/gpu/workloads/ptrs.cu"
  cudasnap capture -o ptxonly.cusnap -- ./ptrs_ptxonly | tail -1
  cudasnap replay ptxonly.cusnap; check "PTX-only module: preflight says JIT, replay verifies" 0 $?
  # as if captured on an A100: the sm_90 snapshot with its module image swapped for the same
  # source built for sm_80 only (SASS, no PTX)
  nvcc -fatbin -gencode arch=compute_80,code=sm_80 -o ptrs_sm80.fatbin "$ROOT/tests/gpu/workloads/ptrs.cu"
  python3 - ptrs.cusnap ptrs_sm80.fatbin sm80.cusnap "$ROOT/tests" <<'EOF'
import sys
sys.path.insert(0, sys.argv[4])
from snapedit import rewrite
image = open(sys.argv[2], "rb").read()
rewrite(sys.argv[1], sys.argv[3], payload=lambda key, data: image if key == "image" else data)
EOF
  cudasnap info sm80.cusnap | grep -A3 "Modules"
  cudasnap replay sm80.cusnap; check "sm_80-only module refused before replay" 2 $?
else
  check "preflight (not built)" 0 1
fi

echo; echo "== summary"; cat "$SUM"
