#!/usr/bin/env bash
# The failure job end to end on a GPU: an nvcc program (bench/failjob.cu, built with -lineinfo) whose kernel `poke`
# writes through an illegal address from one thread of one block, captured with the flight
# recorder, replayed, and replayed under compute-sanitizer memcheck through `replay --wrap`: the
# report must name the kernel, the thread and block, the address and the source line, as memcheck
# does on the program itself, and the replay must exit non-zero. Then the same program without the
# fault: its replay clean under memcheck, under `ncu --section SpeedOfLight` with
# `--profiler-range workload` (ncu sees only the replayed kernels), and with --preload.
# Run from the project root on the GPU machine (with .whl holding the wheels the image lacks):
#   bash bench/failure_job_gpu.sh        (writes $OUT/failure_job.log and the reports; ~2-4 minutes)
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-failure; rm -rf "$W"; mkdir -p "$W"
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do [ -d "$d" ] && PATH=$PATH:$d; done
cd "$W"
exec > >(tee "$OUT/failure_job.log") 2>&1
FAILS=0
check() { local ok=FAIL; [ "$2" = "$3" ] && ok=PASS; [ $ok = FAIL ] && FAILS=$((FAILS + 1)); echo "$ok  $1 (got $3, expected $2)${4:+  $4}"; }
yes_no() { if [ "$2" = 0 ]; then echo "PASS  $1"; else FAILS=$((FAILS + 1)); echo "FAIL  $1"; fi; }
echo "card: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for t in nvcc compute-sanitizer ncu; do echo "$t: $(command -v $t || echo MISSING)"; done
T0=$SECONDS

cp "$ROOT/bench/failjob.cu" .                 # the program (tests/gpu/test_gpu_wrap.py builds it too)
LINE=$(grep -n POKE_LINE failjob.cu | cut -d: -f1)
nvcc -O2 -lineinfo -o failjob failjob.cu || { echo "FAIL  nvcc failjob.cu"; exit 1; }
./failjob 20 1 > native.txt 2>&1; rc=$?; tail -2 native.txt
check "native: the program fails with an illegal address" 1 $rc
grep -q "illegal memory access" native.txt; yes_no "native: the error is an illegal memory access" $?

# memcheck on the program itself: the reference report
compute-sanitizer --tool memcheck ./failjob 20 1 > native_memcheck.txt 2>&1
grep -E "Invalid|at poke|by thread|Address|ERROR SUMMARY" native_memcheck.txt | head -8
REF_THREAD=$(grep -oE "by thread \([0-9,]+\) in block \([0-9,]+\)" native_memcheck.txt | head -1)
echo "memcheck on the program: ${REF_THREAD:-no thread/block found}"

# ---- the failure captured by the flight recorder
cudasnap capture -f -o fail.cusnap --flight-recorder -- ./failjob 20 1 > fail.out 2> fail.err; rc=$?
cat fail.err | tail -3
check "flight recorder: the program's own exit passes through" 1 $rc
[ -f fail.cusnap ]; yes_no "flight recorder: snapshot written on the error" $?
cudasnap info fail.cusnap | grep -Ei "window|calls|trigger|file" | head -6

cudasnap replay fail.cusnap > replay.txt 2>&1; rc=$?; tail -4 replay.txt
grep -Eq "recorded error CUDA_ERROR_ILLEGAL_ADDRESS recurred.*poke" replay.txt
yes_no "replay: the recorded ILLEGAL_ADDRESS recurs in poke (replay exit $rc)" $?

# ---- the same replay under compute-sanitizer memcheck, through --wrap
cudasnap replay fail.cusnap --wrap 'compute-sanitizer --tool memcheck' > memcheck.txt 2>&1; rc=$?
grep -E "replay under|Invalid|at poke|by thread|Address|ERROR SUMMARY" memcheck.txt | head -10
[ "$rc" != 0 ]; yes_no "replay under memcheck exits non-zero (exit $rc)" $?
grep -q "Invalid __global__ write of size 4 bytes" memcheck.txt; yes_no "memcheck names the invalid write" $?
grep -Eq "at poke\(" memcheck.txt; yes_no "memcheck names the kernel poke" $?
grep -q "by thread (17,0,0) in block (3,0,0)" memcheck.txt; yes_no "memcheck names thread (17,0,0) in block (3,0,0)" $?
grep -Eq "(Access to|Address) 0x[0-9a-f]+ is out of bounds" memcheck.txt; yes_no "memcheck names the faulting address" $?
# placement at recorded addresses: the fault is where it was recorded, the buffer + 256 GiB
python3 - <<'PY'
import re
from cudasnap.formats import SnapshotReader
t = open("memcheck.txt").read()
acc = re.search(r"(?:Access to|Address) (0x[0-9a-f]+) is out of bounds", t)
near = re.search(r"nearest allocation at (0x[0-9a-f]+)", t)
rec = [r["a"]["dptr"] for r in SnapshotReader("fail.cusnap").records() if r["k"] == "c" and r["f"].startswith("cuMemAlloc")]
a = int(acc[1], 16) if acc else None
b = int(near[1], 16) if near else None
print(f"faulting address {acc[1] if acc else '?'}, nearest allocation {near[1] if near else '?'}, "
      f"recorded allocations {[hex(x) for x in rec]}")
raise SystemExit(0 if a is not None and b in rec and a - b == 4 << 36 else 1)
PY
yes_no "the replayed fault is at the recorded buffer + 256 GiB, as the program wrote it" $?
grep -q "failjob.cu:$LINE" memcheck.txt; yes_no "memcheck names the source line failjob.cu:$LINE (-lineinfo)" $?
[ -n "$REF_THREAD" ] && grep -qF "$REF_THREAD" memcheck.txt
yes_no "the replay's report names the thread and block memcheck names on the program" $?
cp native_memcheck.txt memcheck.txt "$OUT/" 2>/dev/null

# ---- without the fault: a clean replay under memcheck, under ncu with the workload range, preloaded
cudasnap capture -f -o ok.cusnap -- ./failjob 10 0 > ok.out 2> ok.err; rc=$?
check "capture of the healthy run" 0 $rc
cudasnap replay ok.cusnap --wrap 'compute-sanitizer --tool memcheck' > ok_memcheck.txt 2>&1; rc=$?
grep -E "ERROR SUMMARY|D2H verified|OK:" ok_memcheck.txt
check "healthy replay under memcheck (the replay's own machinery included)" 0 $rc
grep -q "ERROR SUMMARY: 0 errors" ok_memcheck.txt; yes_no "memcheck: 0 errors in the replay" $?

cudasnap replay ok.cusnap --profiler-range workload --wrap 'ncu --section SpeedOfLight' > ncu.txt 2>&1; rc=$?
grep -E "replay under|==PROF==|scale|poke|Throughput" ncu.txt | head -12
check "replay under ncu --section SpeedOfLight" 0 $rc
K=$(grep -cE "^  (scale|poke)\(" ncu.txt)
check "ncu profiled the replayed kernels only (10 steps x 2 launches)" 20 "$K"
grep -q "Memory Throughput" ncu.txt; yes_no "ncu shows its SpeedOfLight section" $?
cp ncu.txt "$OUT/" 2>/dev/null

cat > mark.c <<'EOF'
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) { fprintf(stderr, "PRELOADED in pid %d\n", (int)getpid()); }
EOF
gcc -shared -fPIC -o libmark.so mark.c
cudasnap replay ok.cusnap --preload ./libmark.so > preload.txt 2>&1; rc=$?
check "replay with --preload" 0 $rc
[ "$(grep -c PRELOADED preload.txt)" -ge 1 ]; yes_no "the preloaded library ran in the replay process" $?

echo "failures: $FAILS; total: $((SECONDS - T0)) s"
[ "$FAILS" = 0 ]
