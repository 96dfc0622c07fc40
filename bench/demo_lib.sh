# Sourced by the bench/demo_*_gpu.sh demonstrations: a heading per step and PASS/FAIL lines
# (FAIL becomes 1 at the first failed check; the demo exits with it).
step() { echo; echo "=== $*"; }
FAIL=0
check() { if [ "$1" = 0 ]; then echo "PASS: $2"; else echo "FAIL: $2"; FAIL=1; fi; }
