#!/usr/bin/env bash
# CPU half of the simulator run: simulates, in performance mode on the model of the captured GPU
# (SM90_H100 for an H100), every extract bench/sim_capture_gpu.sh made (unpacked into DIR), each
# verified against the GPU's results; then per program the simulator column (coverage: kernels
# and GPU time that can run there, each n/a with why), the verdicts (EXACT / CLOSE / DIFFERENT /
# refused per kernel, and whether every JIT kernel -- Triton's, CuPy's PTX -- is EXACT or CLOSE),
# and the per-kernel table with the correlation (`cudasnap compare` of the merged GPU timeline
# and simulated profiles, HTML beside).
#   CUDASNAP_GPGPUSIM=/path/to/gpgpu-sim bash bench/sim_replay_cpu.sh DIR [CONFIG]
# MAX_CTAS=N times launches over N CTAs on samples (--sim-max-ctas); PER_KERNEL_S caps each run;
# ONLY='torch_compile cupy_work' simulates those programs' extracts only; SIM_MODE=functional gives
# the verdicts faster, without cycles (no correlation).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); D=$(cd "${1:?usage: sim_replay_cpu.sh DIR [CONFIG]}" && pwd)
: "${CUDASNAP_GPGPUSIM:?set CUDASNAP_GPGPUSIM to the GPGPU-Sim build}"
SIM=gpgpu-sim${2:+:$2}; PER=${PER_KERNEL_S:-600}; MODE=${SIM_MODE:-performance}
echo "== simulator column (coverage, from the snapshot and its GPU timeline)"
python3 "$ROOT/bench/sim_kernels.py" column "$D"
echo "== simulated extracts"
for x in "$D"/*.x.cusnap; do
  [ -f "$x" ] || continue
  n=$(basename "$x" .x.cusnap)
  if [ -n "${ONLY:-}" ] && ! [[ " $ONLY " == *" ${n%%.*} "* ]]; then continue; fi
  t0=$SECONDS
  if [ "$MODE" = performance ]; then
    timeout $PER cudasnap replay "$x" --sim $SIM --sim-mode performance ${MAX_CTAS:+--sim-max-ctas $MAX_CTAS} \
      --out "$D/$n.sim.json" -f > "$D/$n.sim.txt" 2>&1; rc=$?
  else
    timeout $PER cudasnap replay "$x" --sim $SIM > "$D/$n.sim.txt" 2>&1; rc=$?
  fi
  echo $rc > "$D/$n.sim.rc"
  k=$(grep ': [0-9]* cycles' "$D/$n.sim.txt" | tr -s ' ' | cut -c1-100 | paste -sd';')
  echo "$n: exit $rc in $((SECONDS - t0)) s:$k; $(grep -m1 -E '^(OK|FAILED|MISMATCH|DIFFERENT|CLOSE|ERROR|cudasnap: error)' "$D/$n.sim.txt" | cut -c1-160)"
done
echo "== verdicts per program (the target: every JIT kernel EXACT or CLOSE)"
python3 "$ROOT/bench/sim_kernels.py" verdicts "$D" | tee "$D/verdicts.txt"
[ "$MODE" = performance ] && python3 "$ROOT/bench/sim_kernels.py" merge "$D" "$D/all.gpu.json" "$D/all.sim.json" && \
  cudasnap compare "$D/all.gpu.json" "$D/all.sim.json" --html "$D/correlation.html" --top 100
