#!/usr/bin/env bash
# GPU half of the simulator run (one call, at most about 8 minutes on one H100): captures the
# GPU suite's torch_compile.py, cupy_work.py, jax_jit.py and jax_train.py (with --keep-ptx xla: XLA's
# PTX dumped and kept with each cubin), cupy_libs.py while time allows, and the programs
# whose kernels can reach the simulator -- the sim_* nvcc programs of tests/gpu/workloads (PTX
# beside SASS), torch.compile and hand-written Triton kernels (sim_triton.py: their PTX is kept
# from Triton's cache at capture), CuPy's JIT kernels (sim_cupy.py) and a small PyTorch program
# (SASS only: n/a) --, with fresh Triton/Inductor/CuPy caches and CUPY_COMPILE_WITH_PTX=1 (CuPy
# hands its kernels' PTX to the driver). For each: a timeline profile, `info --json`, and the
# simulator coverage with that timeline (PROGRAM.coverage.json/.txt: which kernels, and how much
# GPU time, can run there, each n/a with its reason); then the first launch of every kernel that
# can run is extracted (--check, on this GPU), the suite's workloads first, until BUDGET seconds.
# All of it is packed per program into $OUT/sim_PROGRAM[.N].tar.xz (unpack them all into one DIR)
# for bench/sim_replay_cpu.sh. From the project
# root (carry .whl):
#   OUT=/tmp/out bash bench/sim_capture_gpu.sh
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
W=/tmp/simsnaps; rm -rf $W /tmp/simcaches; mkdir -p $W /tmp/simcaches; cd $W
BUDGET=${BUDGET:-400}        # seconds: no capture or extract starts after it, leaving time to pack
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader | tee card.txt
# fresh JIT caches: every kernel is compiled (and its PTX written) during the capture
export TRITON_CACHE_DIR=/tmp/simcaches/triton TORCHINDUCTOR_CACHE_DIR=/tmp/simcaches/inductor \
       CUPY_CACHE_DIR=/tmp/simcaches/cupy
profile() {   # PROGRAM: info, timeline, coverage
  local p=$1
  cudasnap info $p.cusnap > $p.info.txt 2>&1; cudasnap info $p.cusnap --json > $p.info.json 2>/dev/null
  timeout 120 cudasnap replay $p.cusnap --profile timeline --out $p.gpu.json -f > $p.timeline.txt 2>&1; local rc=$?
  local tl=(); [ $rc -eq 0 ] && [ -f $p.gpu.json ] && tl=(--timeline $p.gpu.json)
  cudasnap info $p.cusnap --sim ${tl[@]+"${tl[@]}"} > $p.coverage.txt 2>&1
  cudasnap info $p.cusnap --sim ${tl[@]+"${tl[@]}"} --json > $p.coverage.json 2>/dev/null
  echo "  $p: timeline exit $rc; $(tail -1 $p.coverage.txt | cut -c1-200)"
}
capture_py() {   # PROGRAM SCRIPT [VAR=VALUE...]: a Python program of tests/gpu/workloads
  local p=$1 script=$2; shift 2
  if [ $SECONDS -gt $BUDGET ]; then echo "budget spent: $p not captured"; return; fi
  local t0=$SECONDS
  # CAPARGS: capture options (word-split)
  timeout 180 env "$@" cudasnap capture -f -o $p.cusnap ${CAPARGS:-} -- python3 "$ROOT/tests/gpu/workloads/$script" > $p.capture.txt 2>&1
  echo "capture $p exit $? in $((SECONDS - t0)) s: $(tail -1 $p.capture.txt | cut -c1-120)"
  [ -f $p.cusnap ] && profile $p
}
CUPY=(CUPY_COMPILE_WITH_PTX=1 CUPY_ACCELERATORS=)
capture_py torch_compile torch_compile.py
capture_py cupy_work cupy_work.py "${CUPY[@]}"
CAPARGS="--keep-ptx xla" capture_py jax_jit jax_jit.py XLA_PYTHON_CLIENT_PREALLOCATE=false
CAPARGS="--keep-ptx xla" capture_py jax_train jax_train.py XLA_PYTHON_CLIENT_PREALLOCATE=false
for p in sim_stencil sim_reduce sim_chase sim_streams; do
  nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75 \
    -o $p "$ROOT/tests/gpu/workloads/$p.cu" || { echo "BUILD FAIL $p"; continue; }
  t0=$SECONDS; cudasnap capture -f -o $p.cusnap -- ./$p > $p.capture.txt 2>&1
  echo "capture $p exit $? in $((SECONDS - t0)) s"; profile $p
done
capture_py sim_triton sim_triton.py
capture_py sim_cupy sim_cupy.py "${CUPY[@]}"
capture_py sim_torch sim_torch.py
if [ $SECONDS -lt $((BUDGET / 2)) ]; then capture_py cupy_libs cupy_libs.py "${CUPY[@]}"
else echo "cupy_libs: not captured (over half the budget spent before it)"; fi
ls /tmp/simcaches/triton 2>/dev/null | head -3 > triton_cache_sample.txt
# the suite's workloads first: their kernels are the target
for p in torch_compile cupy_work jax_jit jax_train sim_triton sim_cupy sim_stencil sim_reduce sim_chase sim_streams cupy_libs; do
  [ -f $p.cusnap ] || continue
  i=0; cap=1000
  case $p in jax_*) cap=${JAX_EXTRACTS:-16};; esac     # XLA's many fusions leave time for the rest
  for spec in $(python3 "$ROOT/bench/sim_kernels.py" specs $p.cusnap | head -n $cap); do
    i=$((i + 1))
    if [ $SECONDS -gt $BUDGET ]; then echo "  budget spent: $p $spec not extracted"; continue; fi
    t0=$SECONDS; echo "$spec" > $p.$i.spec.txt
    timeout 90 cudasnap extract $p.cusnap --kernel "$spec" -o $p.$i.x.cusnap --check -f > $p.$i.extract.txt 2>&1
    echo "extract $p $spec exit $? in $((SECONDS - t0)) s: $(tail -1 $p.$i.extract.txt | cut -c1-120)"
  done
done
rm -f sim_stencil sim_reduce sim_chase sim_streams
echo "== coverage"; python3 "$ROOT/bench/sim_kernels.py" column . | tee coverage.txt
# archives of at most about 10 MB of input per program (what comes back from the GPU machine is
# limited): its extracts, coverage, timeline and logs; whole snapshots only where under 8 MB (the
# extracts are what the CPU half simulates; the coverage JSON holds what the column needs)
python3 - "$OUT" <<'PYEOF'
import glob, os, subprocess, sys
out = sys.argv[1]
for cov in sorted(glob.glob("*.coverage.json")):
    p = cov[:-len(".coverage.json")]
    files = sorted(f for f in glob.glob(p + ".*") if not f.endswith(".cusnap") or f.endswith(".x.cusnap"))
    if os.path.isfile(p + ".cusnap") and os.path.getsize(p + ".cusnap") < 8 << 20:
        files.append(p + ".cusnap")
    parts, cur, size = [], [], 0
    for f in files:
        n = os.path.getsize(f)
        if cur and size + n > 10 << 20:
            parts.append(cur); cur, size = [], 0
        cur.append(f); size += n
    parts.append(cur)
    for i, chunk in enumerate(parts, 1):
        name = f"{out}/sim_{p}.tar.xz" if len(parts) == 1 else f"{out}/sim_{p}.{i}.tar.xz"
        subprocess.run(["tar", "-cJf", name, "card.txt", *chunk], env=dict(os.environ, XZ_OPT="-T0"), check=False)
PYEOF
ls -la "$OUT"
echo "total $SECONDS s"
