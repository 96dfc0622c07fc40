#!/usr/bin/env bash
# Launch-bound PyTorch loop: native, captured with the recorder draining eagerly and lazily
# (--drain), and the shim's ring with no recorder. One OpenBLAS thread in every run.
# Run after gpu_suite.sh installed the package.
set -uo pipefail
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH OPENBLAS_NUM_THREADS=1
ROOT=$(pwd); cd /tmp
SHIM=$(python3 -c 'import cudasnap.shim._shim as s; print(s.__file__)')
L="python3 $ROOT/bench/torch_loop.py 20000 3"
for i in $(seq ${ROUNDS:-6}); do
  n=$($L); e=$(python3 -m cudasnap capture -q -f --drain eager -o e.cusnap -- $L)
  l=$(python3 -m cudasnap capture -q -f --drain lazy -o l.cusnap -- $L)
  rm -rf /dev/shm/ro; mkdir -p /dev/shm/ro
  r=$(CUDASNAP_SESSION=/dev/shm/ro CUDASNAP_RING_MB=1024 LD_PRELOAD=$SHIM $L)
  echo "native ${n:7:6} eager ${e:7:6} lazy ${l:7:6} ringonly ${r:7:6}"
done
rm -rf /dev/shm/ro
python3 -m cudasnap info l.cusnap | grep -E "calls|launches" | head -3
