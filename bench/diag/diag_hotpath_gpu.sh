#!/usr/bin/env bash
# CPU cost of interception on the GPU machine: through the test-double driver (so the
# GPU launch queue cannot hide or add anything), then on the real driver. Run after gpu_suite.sh.
set -uo pipefail
export PYTHONPATH=/tmp/site
ROOT=$(pwd)
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
python3 -c "import sys; sys.path.insert(0, '$ROOT/tests/double'); import build; build.build('/tmp/dbl')" > /dev/null
gcc -O2 -I "$ROOT/tests/double" -o /tmp/hotpath "$ROOT/bench/hotpath_double.c" -ldl
SHIM=$(cd /tmp && python3 -c 'import cudasnap.shim._shim as s; print(s.__file__)')
for i in 1 2 3; do
  echo "native : $(LD_LIBRARY_PATH=/tmp/dbl/lib /tmp/hotpath 500000 | head -3 | tr '\n' ' ')"
  rm -rf /dev/shm/hp && mkdir -p /dev/shm/hp
  echo "shim   : $(LD_LIBRARY_PATH=/tmp/dbl/lib CUDASNAP_SESSION=/dev/shm/hp CUDASNAP_RING_MB=1024 LD_PRELOAD=$SHIM /tmp/hotpath 500000 | head -3 | tr '\n' ' ')"
done
rm -rf /dev/shm/hp
# the same on the real driver (bench/hotpath_gpu.cu): native, ring only, full capture
nvcc -O2 -arch=sm_90 -o /tmp/hotpath_gpu "$ROOT/bench/hotpath_gpu.cu" -lcuda || exit 1
for i in 1 2 3; do
  echo "gpu native : $(/tmp/hotpath_gpu 200000 | tr '\n' ' ')"
  rm -rf /dev/shm/hp && mkdir -p /dev/shm/hp
  echo "gpu ring   : $(CUDASNAP_SESSION=/dev/shm/hp CUDASNAP_RING_MB=1024 LD_PRELOAD=$SHIM /tmp/hotpath_gpu 200000 | tr '\n' ' ')"
  echo "gpu capture: $(cd /tmp && python3 -m cudasnap capture -q -f -o /tmp/hp.cusnap -- /tmp/hotpath_gpu 200000 | tr '\n' ' ')"
done
rm -rf /dev/shm/hp
