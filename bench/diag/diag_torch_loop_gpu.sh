#!/usr/bin/env bash
# Where the launch-bound PyTorch loop's capture overhead comes from. Alternates, per round:
# native and captured, then with OPENBLAS_NUM_THREADS=1: native; the shim preloaded with no session (interception only, nothing recorded); the
# shim writing its ring with no recorder draining it (shim cost alone); a full capture.
# With PERF_DIR (a folder holding perf, its libraries and ld-linux-x86-64.so.2) it also
# writes flat perf profiles, by DSO and by symbol, of native and captured runs to $OUT.
# Run after gpu_suite.sh installed the package.
set -uo pipefail
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
ROOT=$(pwd); W=/tmp/diagt; mkdir -p $W; cd $W
SHIM=$(python3 -c 'import cudasnap.shim._shim as s; print(s.__file__)')
L="python3 $ROOT/bench/torch_loop.py 20000 3"
for i in 1 2 3 4; do
  echo "native        $($L)"
  echo "capture       $(python3 -m cudasnap capture -q -f -o c.cusnap -- $L)"
  # numpy's OpenBLAS threads (imported with torch) spin on every core: one thread of it
  export OPENBLAS_NUM_THREADS=1
  echo "native b1     $($L)"
  echo "passthru b1   $(LD_PRELOAD=$SHIM $L)"
  rm -rf /dev/shm/ro; mkdir -p /dev/shm/ro
  echo "ring only b1  $(CUDASNAP_SESSION=/dev/shm/ro CUDASNAP_RING_MB=2048 LD_PRELOAD=$SHIM $L)"
  echo "capture b1    $(python3 -m cudasnap capture -q -f -o c.cusnap -- $L)"
  unset OPENBLAS_NUM_THREADS
done
rm -rf /dev/shm/ro
python3 -m cudasnap info c.cusnap > "$OUT/torch_loop_info.txt" 2>&1
grep -iE "calls|launch" "$OUT/torch_loop_info.txt" | head -20
if [ -n "${PERF_DIR:-}" ]; then
  PERF="$PERF_DIR/ld-linux-x86-64.so.2 --library-path $PERF_DIR $PERF_DIR/perf"
  export OPENBLAS_NUM_THREADS=1
  $PERF record -q -o native.data -- $L 2>&1 | tail -2
  # perf around the capture (perf run under the preloaded shim fails: its bundled libc is
  # older than the shim's); program and recorder are told apart by pid in the reports
  $PERF record -q -o capture.data -- python3 -m cudasnap capture -q -f -o p.cusnap -- $L 2>&1 | tail -2
  for m in native capture; do
    $PERF report -i $m.data --stdio --sort pid,dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25 > "$OUT/perf_${m}_dso.txt"
    $PERF report -i $m.data --stdio --sort pid,dso,sym 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60 > "$OUT/perf_${m}_sym.txt"
  done
  $PERF stat -e task-clock,cycles,instructions,cache-misses,page-faults -o "$OUT/perf_stat_native.txt" -- $L
  $PERF stat -e task-clock,cycles,instructions,cache-misses,page-faults -o "$OUT/perf_stat_ringonly.txt" -- env CUDASNAP_SESSION=/dev/shm CUDASNAP_RING_MB=2048 LD_PRELOAD=$SHIM $L
  rm -f /dev/shm/ring-*.shm
  head -30 "$OUT"/perf_native_dso.txt "$OUT"/perf_capture_dso.txt
fi
