#!/usr/bin/env bash
# GPU demonstration of `cudasnap compare`, `replay --replace` and `cudasnap bisect` on one GPU
# and one driver: builds bench/demo_ab.cu (three kernels with C names) and rebuilt cubins of it,
# captures it, then
#   1. profiles the snapshot twice, five times over, and compares each pair (expected: SAME, exit 0),
#      plus one pair of timeline profiles;
#   2. replays with compute_k swapped for the same -O3 build (expected: SAME), for a -G build
#      (expected: compute_k alone SLOWER, exit 1) and for a build with another parameter layout
#      (expected: refused, exit 2);
#   3. bisects six environments: 1 plain, 2 CUDA_MODULE_LOADING=EAGER, 3 the -O3 rebuild swapped in
#      through CUDASNAP_REPLACE, 4-6 the -G build swapped in (expected: first bad = env 4, at
#      most ceil(log2 6) + 2 = 5 replays).
# Writes under $OUT: demo.log, compare_same.html, compare_replace.html, bisect.html, bisect.json,
# demo_files.tar.gz (every profile, comparison and the envs file).
# Run from the project root on the GPU machine (with .whl holding the wheels the image lacks,
# plotly and narwhals among them; without plotly no HTML is written):
#   bash bench/demo_bisect_gpu.sh
# Env: REPEAT (isolated repeats, default 10), ARCH (default sm_90), N / ITERS (problem size).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-demo; rm -rf "$W"; mkdir -p "$W/keep"
REPEAT=${REPEAT:-10}; ARCH=${ARCH:-sm_90}; N=${N:-16777216}; ITERS=${ITERS:-128}
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
exec > >(tee "$OUT/demo.log") 2>&1
HTML=1; python3 -c 'import plotly' 2>/dev/null || { HTML=; echo "plotly missing: no HTML reports (carry its wheels in .whl)"; }
html() { [ -n "$HTML" ] && echo "--html $OUT/$1"; }
step() { echo; echo "=== $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd "$W"

step "build (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $ARCH)"
nvcc -O3 -arch=$ARCH -o demo_ab "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -O3 -cubin -arch=$ARCH -o same_O3.cubin "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -G -cubin -arch=$ARCH -o slow_G.cubin "$ROOT/bench/demo_ab.cu" || exit 2
nvcc -O3 -cubin -arch=$ARCH -DWIDE_N -o wide_n.cubin "$ROOT/bench/demo_ab.cu" || exit 2
ls -l *.cubin
./demo_ab $N $ITERS || exit 2

step "capture"
cudasnap capture -o demo.cusnap -- ./demo_ab $N $ITERS || exit 2
cudasnap replay demo.cusnap -q; echo "plain replay exit $?"

prof() {  # prof OUT.json [extra replay args...]
  local o=$1; shift
  cudasnap replay demo.cusnap --profile isolated --repeat $REPEAT --warmup 3 --out "$o" -q "$@" > "$o.log" 2>&1
  local rc=$?; [ $rc -eq 0 ] || { echo "replay for $o: exit $rc"; tail -3 "$o.log"; }
  return $rc
}

step "1. compare: two isolated profiles of the same snapshot, 5 times (expected SAME, exit 0)"
for i in 1 2 3 4 5; do
  prof a$i.json && prof b$i.json || exit 2
  extra=""; [ $i = 1 ] && extra=$(html compare_same.html)
  cudasnap compare a$i.json b$i.json $extra > compare_same_$i.txt; rc=$?
  echo "pair $i: exit $rc: $(tail -1 compare_same_$i.txt)"
  cudasnap compare a$i.json b$i.json --json > compare_same_$i.json
done
cat compare_same_1.txt
cudasnap replay demo.cusnap --profile timeline --out ta.json -q > /dev/null 2>&1
cudasnap replay demo.cusnap --profile timeline --out tb.json -q > /dev/null 2>&1
cudasnap compare ta.json tb.json > compare_timeline.txt; echo "timeline pair: exit $?"; cat compare_timeline.txt

step "2. replay --replace compute_k"
prof same_build.json --replace compute_k=$W/same_O3.cubin || exit 2
grep -h "replace" same_build.json.log
cudasnap compare a1.json same_build.json > compare_same_build.txt; echo "-O3 rebuild swapped in: exit $?"
cat compare_same_build.txt
prof slow_build.json --replace compute_k=$W/slow_G.cubin || exit 2
cudasnap compare a1.json slow_build.json $(html compare_replace.html) > compare_replace.txt; echo "-G build swapped in: exit $? (expected 1)"
cat compare_replace.txt
cudasnap compare a1.json slow_build.json --json > compare_replace.json
cudasnap replay demo.cusnap -q --replace compute_k=$W/wide_n.cubin; echo "64-bit n build swapped in: exit $? (expected 2)"
cudasnap replay demo.cusnap -q --replace module:compute_k=$W/wide_n.cubin; echo "its whole module: exit $? (expected 2)"

step "3. bisect over 6 environments (expected: first bad env 4 'G-build-1', <= 5 replays)"
cat > envs.toml <<EOF
[[env]]
name = "plain"

[[env]]
name = "eager-loading"
vars = { CUDA_MODULE_LOADING = "EAGER" }

[[env]]
name = "O3-rebuild"
vars = { CUDASNAP_REPLACE = "compute_k=$W/same_O3.cubin" }

[[env]]
name = "G-build-1"
vars = { CUDASNAP_REPLACE = "compute_k=$W/slow_G.cubin" }

[[env]]
name = "G-build-2"
vars = { CUDASNAP_REPLACE = "compute_k=$W/slow_G.cubin", CUDA_MODULE_LOADING = "EAGER" }

[[env]]
name = "G-build-3"
vars = { CUDASNAP_REPLACE = "compute_k=$W/slow_G.cubin" }
EOF
cudasnap bisect demo.cusnap --envs envs.toml --repeat $REPEAT --keep $W/keep $(html bisect.html)
echo "bisect exit $? (expected 1: a regression)"
cudasnap bisect demo.cusnap --envs envs.toml --repeat $REPEAT --json > "$OUT/bisect.json" 2> bisect_json.log
echo "bisect --json exit $?: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('message'), '| replays', d['replays'], 'of at most', d['max_replays'])" "$OUT/bisect.json")"

step "files"
tar czf "$OUT/demo_files.tar.gz" *.json *.txt *.log envs.toml keep 2>/dev/null
ls -l "$OUT"
