#!/usr/bin/env bash
# Where capture overhead goes on the GPU machine: the launch-bound PyTorch loop native, with
# the shim preloaded but no session (interception only), and captured; the calls it makes;
# the host's CPU/cgroup/disk limits that bound H2D capture. Usage: bash bench/diag_capture_gpu.sh
set -uo pipefail
SKIP_EXAMPLE=1 SKIP_SUITE=1 SKIP_BENCH=1 bash bench/gpu_suite.sh > /dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
ROOT=$(pwd); W=/tmp/diagc; mkdir -p $W; cd $W
echo "nproc $(nproc); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null)"; df -h /dev/shm /tmp | tail -2
SHIM=$(python3 -c 'import cudasnap.shim._shim as s; print(s.__file__)')
for i in 1 2 3; do
  echo "native   $(python3 $ROOT/bench/torch_loop.py 20000)"
  echo "preload  $(LD_PRELOAD=$SHIM python3 $ROOT/bench/torch_loop.py 20000)"
  echo "capture  $(python3 -m cudasnap capture -q -o loop$i.cusnap -- python3 $ROOT/bench/torch_loop.py 20000)"
done
python3 -m cudasnap info loop1.cusnap --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['calls']['total'], sorted(d['calls']['by_name'].items(), key=lambda kv: -kv[1])[:12])"
python3 - <<'PY'
import os, time, threading
buf = os.urandom(4 << 20)
for nthr in (1, 4, 8):
    fd = os.open("/tmp/diagc/w.bin", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    n = 512; t0 = time.perf_counter()
    def w(k):
        for i in range(k, n, nthr): os.pwrite(fd, buf, i * len(buf))
    ts = [threading.Thread(target=w, args=(k,)) for k in range(nthr)]
    [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.perf_counter() - t0; os.close(fd)
    print(f"pwrite 2 GiB to /tmp, {nthr} threads: {2 / dt:.1f} GiB/s")
    os.unlink("/tmp/diagc/w.bin")
PY
nvcc -O2 -arch=sm_90 -o h2d "$ROOT/bench/h2d_loop.cu"
for mode in same unique; do
  echo "h2d $mode native  $(./h2d 8 $mode)"
  t0=$(date +%s.%N)
  echo "h2d $mode capture $(python3 -m cudasnap capture -q -o h2d_$mode.cusnap -- ./h2d 8 $mode)  (whole capture $(echo "$(date +%s.%N) - $t0" | bc) s)"
done
