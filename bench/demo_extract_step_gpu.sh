#!/usr/bin/env bash
# GPU demonstration of `cudasnap extract` on a PyTorch training loop (bench/demo_torch_train.py):
#   1. capture the loop; find the calls of one training step from its NVTX range "step 3";
#   2. extract --calls of that step -> a snapshot that replays verified;
#   3. extract --kernel of one GEMM -> its size against the original's (an 8-layer model: each
#      weight is 1/8 of the snapshot, so the < 5% goal is checked on a deeper one by
#      bench/demo_extract_gemm_gpu.sh), replays verified, exported to C, built with gcc, run verified.
# Run from the project root on the GPU machine (with .whl holding the wheels the image lacks):
#   bash bench/demo_extract_step_gpu.sh      (writes $OUT/demo_extract.log)
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-extract; rm -rf "$W"; mkdir -p "$W"
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
cd "$W"
exec > >(tee "$OUT/demo_extract.log") 2>&1
check() { local ok=FAIL; [ "$2" = "$3" ] && ok=PASS; echo "$ok  $1 (exit $3, expected $2)${4:+  $4}"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 "$ROOT/bench/demo_torch_train.py" 5 > native.txt
cudasnap capture -f -o train.cusnap -- python3 "$ROOT/bench/demo_torch_train.py" 5 > captured.txt
cmp -s native.txt captured.txt; check "output identical under capture" 0 $?
RANGE=$(python3 - <<'EOF'
from cudasnap.formats import SnapshotReader
inside, seqs = False, []
for r in SnapshotReader("train.cusnap").records():
    if r["k"] == "nvtx" and r.get("name") == "step 3":
        inside = r.get("op") in ("push", "start")
    elif r["k"] == "c" and inside:
        seqs.append(r["s"])
print(f"{min(seqs)}-{max(seqs)}" if seqs else "")
EOF
)
echo "step 3 is calls $RANGE"
[ -n "$RANGE" ]; check "NVTX range 'step 3' found" 0 $?
cudasnap extract train.cusnap --calls "$RANGE" -o step.cusnap --check; check "extract --calls (one training step) --check" 0 $?
cudasnap replay step.cusnap; check "replay of the extracted step verifies" 0 $?
cudasnap extract train.cusnap --kernel 'gemm|Gemm|nvjet' -o gemm.cusnap; check "extract --kernel (one GEMM)" 0 $?
orig=$(stat -c %s train.cusnap); small=$(stat -c %s gemm.cusnap)
echo "INFO  extracted GEMM: $small of $orig bytes ($(python3 -c "print(f'{100 * $small / $orig:.2f}')")%)"
cudasnap replay gemm.cusnap; check "replay of the extracted GEMM verifies" 0 $?
cudasnap export gemm.cusnap -o gemm_c && make -C gemm_c CC=gcc CUDA_HOME="$CUDA_HOME" > make.log 2>&1; check "export + gcc build" 0 $?
./gemm_c/replay; check "exported GEMM program runs and verifies" 0 $?
