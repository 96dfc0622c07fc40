#!/usr/bin/env bash
# GPU half of the simulator correlation run (one call, about 6-8 minutes on one H100): captures
# the programs whose kernels can reach the simulator -- the sim_* nvcc programs of
# tests/gpu/workloads (PTX beside SASS), torch.compile and hand-written Triton kernels
# (sim_triton.py: their PTX is kept from Triton's cache at capture), CuPy's JIT kernels
# (sim_cupy.py, CUPY_COMPILE_WITH_PTX=1) and a small PyTorch program (SASS only: n/a) --, times
# each with a timeline profile, writes `info --json` (which kernels carry PTX, and from where),
# extracts the first launch of every kernel with PTX (--check, on this GPU) and packs it all into
# $OUT/simsnaps.tar.xz for bench/sim_replay_cpu.sh. Run from the project root (carry .whl):
#   OUT=/tmp/out bash bench/sim_capture_gpu.sh
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
W=/tmp/simsnaps; rm -rf $W /tmp/simcaches; mkdir -p $W /tmp/simcaches; cd $W
BUDGET=${BUDGET:-420}        # seconds: extracts stop here, leaving time to pack (a call has 540)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader | tee card.txt
# fresh JIT caches: every kernel is compiled (and its PTX written) during the capture
export TRITON_CACHE_DIR=/tmp/simcaches/triton TORCHINDUCTOR_CACHE_DIR=/tmp/simcaches/inductor \
       CUPY_CACHE_DIR=/tmp/simcaches/cupy
profile() {   # PROGRAM: info, timeline
  local p=$1
  cudasnap info $p.cusnap > $p.info.txt 2>&1; cudasnap info $p.cusnap --json > $p.info.json 2>/dev/null
  cudasnap replay $p.cusnap --profile timeline --out $p.gpu.json -f > $p.timeline.txt 2>&1
  echo "  $p: timeline exit $?, $(grep -c . <(python3 "$ROOT/bench/sim_kernels.py" specs $p.cusnap)) kernel(s) with PTX"
}
for p in sim_stencil sim_reduce sim_chase sim_streams; do
  nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75 \
    -o $p "$ROOT/tests/gpu/workloads/$p.cu" || { echo "BUILD FAIL $p"; continue; }
  t0=$SECONDS; cudasnap capture -f -o $p.cusnap -- ./$p > $p.capture.txt 2>&1
  echo "capture $p exit $? in $((SECONDS - t0)) s"; profile $p
done
t0=$SECONDS; cudasnap capture -f -o sim_triton.cusnap -- python3 "$ROOT/tests/gpu/workloads/sim_triton.py" > sim_triton.capture.txt 2>&1
echo "capture sim_triton exit $? in $((SECONDS - t0)) s: $(tail -1 sim_triton.capture.txt)"; profile sim_triton
t0=$SECONDS; CUPY_COMPILE_WITH_PTX=1 CUPY_ACCELERATORS= cudasnap capture -f -o sim_cupy.cusnap -- \
  python3 "$ROOT/tests/gpu/workloads/sim_cupy.py" > sim_cupy.capture.txt 2>&1
echo "capture sim_cupy exit $? in $((SECONDS - t0)) s: $(tail -1 sim_cupy.capture.txt)"; profile sim_cupy
t0=$SECONDS; cudasnap capture -f -o sim_torch.cusnap -- python3 "$ROOT/tests/gpu/workloads/sim_torch.py" > sim_torch.capture.txt 2>&1
echo "capture sim_torch exit $? in $((SECONDS - t0)) s"; profile sim_torch
ls /tmp/simcaches/triton 2>/dev/null | head -3 > triton_cache_sample.txt
for p in sim_stencil sim_reduce sim_chase sim_streams sim_triton sim_cupy; do
  [ -f $p.cusnap ] || continue
  i=0
  for spec in $(python3 "$ROOT/bench/sim_kernels.py" specs $p.cusnap); do
    i=$((i + 1))
    if [ $SECONDS -gt $BUDGET ]; then echo "  budget spent: $p $spec not extracted"; continue; fi
    t0=$SECONDS
    cudasnap extract $p.cusnap --kernel "$spec" -o $p.$i.x.cusnap --check -f > $p.$i.extract.txt 2>&1
    echo "extract $p $spec exit $? in $((SECONDS - t0)) s: $(tail -1 $p.$i.extract.txt | cut -c1-120)"
  done
done
rm -f sim_stencil sim_reduce sim_chase sim_streams
find . -name '*.cusnap' -size +40M -printf 'dropped (too large to bring back): %p %s\n' -delete
tar -cJf "$OUT/simsnaps.tar.xz" . && ls -la "$OUT"
echo "total $SECONDS s"
