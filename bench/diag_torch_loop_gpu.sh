#!/usr/bin/env bash
# Where the launch-bound PyTorch loop's capture overhead comes from: native, captured,
# captured with --all-queries / --placement off, and the shim writing its ring with no
# recorder draining it (shim cost alone). Run after gpu_suite.sh installed the package.
set -uo pipefail
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
ROOT=$(pwd); W=/tmp/diagt; mkdir -p $W; cd $W
SHIM=$(python3 -c 'import cudasnap.shim._shim as s; print(s.__file__)')
L="python3 $ROOT/bench/torch_loop.py 20000 3"
for i in 1 2 3; do
  echo "native        $($L)"
  echo "capture       $(python3 -m cudasnap capture -q -o c.cusnap -- $L)"
  echo "all-queries   $(python3 -m cudasnap capture -q --all-queries -o a.cusnap -- $L)"
  echo "placement off $(python3 -m cudasnap capture -q --placement off -o p.cusnap -- $L)"
  rm -rf /dev/shm/ro; mkdir -p /dev/shm/ro
  echo "ring only     $(CUDASNAP_SESSION=/dev/shm/ro CUDASNAP_RING_MB=2048 LD_PRELOAD=$SHIM $L)"
done
rm -rf /dev/shm/ro
python3 -m cudasnap info c.cusnap | grep -i "calls"
