#!/usr/bin/env bash
# GPU half of the simulator demonstration: builds the sim_* nvcc programs of tests/gpu/workloads
# with PTX beside SASS, captures them (and a small PyTorch program) on the GPU, replays and
# profiles each on the GPU, extracts one launch of each and profiles the extract too. Everything
# lands in $OUT/simsnaps.tar.xz, to be replayed on the simulator on a CPU machine
# (bench/sim_replay_cpu.sh). Run from the project root on the GPU machine (carry .whl).
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
W=/tmp/simsnaps; rm -rf $W; mkdir -p $W; cd $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee card.txt
# name : kernel of the launch to extract (REGEX#K, K from 1)
declare -A PICK=([sim_stencil]='jacobi#3' [sim_reduce]='block_sum#1' [sim_chase]='chase#1'
                 [sim_streams]='saxpy#3' [sim_chase_dev]='scale_all#1' [sim_reduce_hist]='histogram#1')
for p in sim_stencil sim_reduce sim_chase sim_streams; do
  nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75 \
    -o $p "$ROOT/tests/gpu/workloads/$p.cu" || { echo "BUILD FAIL $p"; continue; }
  ./$p > $p.native.txt 2>&1; echo "native $p exit $?"
  cudasnap capture -f -o $p.cusnap -- ./$p > $p.capture.txt 2>&1; echo "capture $p exit $?"
  cmp <(grep -v '^cudasnap' $p.capture.txt) $p.native.txt && echo "  output identical"
  cudasnap replay $p.cusnap > $p.replay.txt 2>&1; echo "replay $p exit $? $(tail -1 $p.replay.txt)"
  cudasnap replay $p.cusnap --profile timeline --out $p.gpu.json -f > /dev/null 2>&1; echo "timeline $p exit $?"
done
cp sim_chase.cusnap sim_chase_dev.cusnap; cp sim_reduce.cusnap sim_reduce_hist.cusnap
for p in sim_stencil sim_reduce sim_chase sim_streams sim_chase_dev sim_reduce_hist; do
  t0=$SECONDS
  cudasnap extract $p.cusnap --kernel "${PICK[$p]}" -o $p.x.cusnap --check -f > $p.extract.txt 2>&1
  echo "extract $p ${PICK[$p]} exit $? $(stat -c %s $p.x.cusnap 2>/dev/null) of $(stat -c %s $p.cusnap) bytes, $((SECONDS - t0)) s"
  cudasnap replay $p.x.cusnap --profile timeline --out $p.x.gpu.json -f > $p.x.replay.txt 2>&1; echo "  extract timeline exit $?"
done
python3 "$ROOT/tests/gpu/workloads/sim_torch.py" > sim_torch.native.txt 2>&1; echo "native torch exit $?"
cudasnap capture -f -o sim_torch.cusnap -- python3 "$ROOT/tests/gpu/workloads/sim_torch.py" > sim_torch.capture.txt 2>&1
echo "capture torch exit $? $(stat -c %s sim_torch.cusnap) bytes"; ls -la sim_torch*.cusnap
cudasnap info sim_torch.cusnap > sim_torch.info.txt 2>&1
cudasnap dump sim_torch.cusnap --calls launches > sim_torch.launches.txt 2>&1
cudasnap extract sim_torch.cusnap --kernel 'MulFunctor#1' -o sim_torch.x.cusnap --check -f > sim_torch.extract.txt 2>&1
echo "extract torch exit $? $(stat -c %s sim_torch.x.cusnap 2>/dev/null) bytes"
cudasnap replay sim_torch.x.cusnap --profile timeline --out sim_torch.x.gpu.json -f > sim_torch.x.replay.txt 2>&1; echo "  torch extract timeline exit $?"
cudasnap dump sim_torch.x.cusnap --format jsonl > sim_torch.x.dump.jsonl 2>&1
# the PTX build of that kernel, which the simulator needs, replayed on silicon as well (JIT by the driver)
K=$(grep -o '_ZN2at6native29vectorized_elementwise_kernel[A-Za-z0-9_]*MulFunctor[A-Za-z0-9_]*' sim_torch.launches.txt | head -1)
nvcc -ptx -arch=compute_75 --expt-relaxed-constexpr "$ROOT/bench/sim_torch_mul.cu" -o sim_torch_mul.ptx
cudasnap replay sim_torch.x.cusnap --replace "$K=sim_torch_mul.ptx" > sim_torch.x.ptx_replay.txt 2>&1
echo "  torch extract with the PTX build, on the GPU: exit $? $(tail -1 sim_torch.x.ptx_replay.txt)"
rm -f sim_stencil sim_reduce sim_chase sim_streams
find . -name '*.cusnap' -size +12M -printf 'dropped (too large to bring back): %p %s\n' -delete
tar -cJf "$OUT/simsnaps.tar.xz" . && ls -la "$OUT"
