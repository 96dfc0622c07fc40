#!/usr/bin/env bash
# One decode per replay and one preflight for every entry point, on the GPU machine (one call,
# about 6-8 min on one H100; nvcc and PyTorch from .whl):
#   1. preflight: an nvcc program captured, its module image swapped for a cubin built for
#      sm_80 only (no PTX); replayed plain, --profile timeline, --profile isolated, and through
#      replay() of the Python API: each refused (exit 2) before anything runs, naming the module;
#      and the unswapped snapshot verifies under the same three;
#   2. counts (bench/count_passes.py --snapshot): opens, passes over the records, frames
#      decompressed per command on that capture and on a captured launch-bound PyTorch loop (bench/torch_loop.py);
#   3. replay speed: bench/bench_replay_gpu.py's training-loop rows (native, plain replay,
#      timeline, graph), with --against the build at BASE when given (another revision's source,
#      e.g. carried under .perf/base: this build over that one, per round, machine cancelled).
# Run from the project root (carry .whl, and .perf for BASE):
#   bash bench/decode_gpu.sh            BASE=.perf/base bash bench/decode_gpu.sh
# Results under $OUT: decode.log, counts.json, bench_replay.json.
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
W=$(mktemp -d); cd "$W"
LOG=$OUT/decode.log
say() { echo "$@" | tee -a "$LOG"; }
fails=0
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
say "card: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) (sm_$ARCH)"

# ---- 1. preflight on every entry point
nvcc -O2 -arch=sm_$ARCH -o loop "$ROOT/bench/launch_loop.cu" && nvcc -cubin -arch=sm_80 -o k80.cubin "$ROOT/bench/launch_loop.cu" || exit 2
python3 -m cudasnap capture -q -f -o loop.cusnap -- ./loop 2000 2 >/dev/null || exit 2
PYTHONPATH=$ROOT/tests:$PYTHONPATH python3 - <<'PY' || exit 2
from snapedit import rewrite
img = open("k80.cubin", "rb").read()
rewrite("loop.cusnap", "loop80.cusnap", payload=lambda key, data: img if key == "image" else data)
PY
for snap in loop.cusnap loop80.cusnap; do
  want=0; [ $snap = loop80.cusnap ] && want=2
  for extra in "" "--profile timeline" "--profile isolated --repeat 2 --warmup 1 -c 3"; do
    python3 -m cudasnap replay $snap $extra > r.out 2> r.err; rc=$?
    ok=PASS
    if [ $rc -ne $want ]; then ok=FAIL; fi
    if [ $want = 2 ] && ! grep -q "preflight: module of call" r.err; then ok=FAIL; fi
    [ $ok = FAIL ] && fails=$((fails+1))
    say "$ok preflight: replay $snap $extra -> exit $rc (want $want) $(grep -m1 'preflight' r.err | cut -c1-160)"
  done
  python3 -c "import sys; from cudasnap.replay import replay; r = replay(sys.argv[1]); print(r.exit_code, r.calls, (r.errors or [''])[0][:140])" $snap > api.out 2>&1
  rc=$(cut -d' ' -f1 api.out)
  ok=PASS; [ "$rc" != "$want" ] && { ok=FAIL; fails=$((fails+1)); }
  say "$ok preflight: replay() $snap -> $(cat api.out | tail -1)"
done

# ---- 2. counts on real captures
timeout 240 python3 -m cudasnap capture -q -f -o train.cusnap -- python3 "$ROOT/bench/torch_loop.py" 3000 1 >/dev/null 2>&1
snaps="--snapshot loop.cusnap"; [ -s train.cusnap ] && snaps="$snaps --snapshot train.cusnap"
timeout 300 python3 "$ROOT/bench/count_passes.py" $snaps --only replay,campaign,info --json "$OUT/counts.json" 2>&1 | tee -a "$LOG"
python3 - "$OUT/counts.json" <<'PY' | tee -a "$LOG"
import json, sys
rows = json.load(open(sys.argv[1]))
bad = [r for r in rows if r["command"].startswith(("replay", "campaign")) and (r.get("opens"), r.get("passes")) != (1, 1)]
print(("FAIL" if bad else "PASS") + f" counts: every replay, profiled replay and campaign cell opens its snapshot once and passes over its records once ({len(bad)} not)")
PY
grep -q "^FAIL counts" "$LOG" && fails=$((fails+1))

# ---- 3. replay speed (training loop), against BASE's build when given
AGAINST=()
if [ -n "${BASE:-}" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/base-site "$ROOT/$BASE" \
    > "$OUT/base-install.log" 2>&1 && AGAINST=(--against /tmp/base-site) || say "BASE $BASE did not install (see base-install.log)"
fi
cd /tmp
timeout ${BENCH_TIMEOUT:-300} python3 "$ROOT/bench/bench_replay_gpu.py" --reps "${REPS:-3}" --steps "${STEPS:-40}" \
  --skip launch,big "${AGAINST[@]}" --json "$OUT/bench_replay.json" 2>&1 | tee -a "$LOG"
say "decode_gpu: $fails failure(s)"
exit $(( fails > 0 ))
