#!/usr/bin/env bash
# Where unique H2D capture throughput goes: bench/h2d_loop.cu (8 x 256 MiB of new random
# data) captured with several --segments / --copy-threads / --threads / --drain settings,
# then one run under a system-wide perf profile (CPU busy share per thread name and the hot
# symbols). Run after gpu_suite.sh installed the package; PERF=path/to/perf-bundle optional.
set -uo pipefail
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
ROOT=$(pwd); OUT=${OUT:-/tmp}; W=/tmp/cs-h2d; mkdir -p $W; cd $W
nvcc -O2 -arch=sm_90 -o h2d_loop "$ROOT/bench/h2d_loop.cu" || exit 2
cap() { python3 -m cudasnap capture -q -f -o $W/h.cusnap "$@" -- ./h2d_loop 8 unique; rm -f $W/h.cusnap; }
echo "native: $(./h2d_loop 8 unique)"
# VARIANTS: ';'-separated capture option sets (default below); REPS runs of each
IFS=';' read -ra VS <<< "${VARIANTS:---segments 4;--segments 8;--segments 12;--segments 8 --copy-threads 4;--segments 8 --threads 24;--segments 8 --drain eager;--segments 8 --ring-mb 512}"
for v in "${VS[@]}"; do
  for rep in $(seq ${REPS:-2}); do echo "$v: $(cap $v)"; done
done
if [ -n "${PERF:-}" ]; then
  P="$PERF/ld-linux-x86-64.so.2 --library-path $PERF $PERF/perf"
  $P record -a -g -F 999 -o $W/p.data -- python3 -m cudasnap capture -q -f -o $W/h.cusnap --segments 8 -- ./h2d_loop 16 unique 2>&1 | tail -3
  $P report -i $W/p.data --no-children --sort comm --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -25
  $P report -i $W/p.data --no-children --sort comm,sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -45
  rm -f $W/p.data $W/h.cusnap
fi
