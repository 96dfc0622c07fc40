#!/usr/bin/env bash
# CPU half of the simulator correlation run: simulates, in performance mode on the model of the
# captured GPU (SM90_H100 for an H100), every extract bench/sim_capture_gpu.sh made (unpacked
# into DIR), each verified against the GPU's results; then the simulator column (per program:
# kernels and GPU time with PTX, n/a with why) and the per-kernel table with the correlation
# (`cudasnap compare` of the merged GPU timeline and simulated profiles, HTML beside).
#   CUDASNAP_GPGPUSIM=/path/to/gpgpu-sim bash bench/sim_replay_cpu.sh DIR [CONFIG]
# MAX_CTAS=N times launches over N CTAs on samples (--sim-max-ctas); PER_KERNEL_S caps each run.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); D=$(cd "${1:?usage: sim_replay_cpu.sh DIR [CONFIG]}" && pwd)
: "${CUDASNAP_GPGPUSIM:?set CUDASNAP_GPGPUSIM to the GPGPU-Sim build}"
SIM=gpgpu-sim${2:+:$2}; PER=${PER_KERNEL_S:-600}
python3 "$ROOT/bench/sim_kernels.py" column "$D"
for x in "$D"/*.x.cusnap; do
  [ -f "$x" ] || continue
  n=$(basename "$x" .x.cusnap); t0=$SECONDS
  timeout $PER cudasnap replay "$x" --sim $SIM --sim-mode performance ${MAX_CTAS:+--sim-max-ctas $MAX_CTAS} \
    --out "$D/$n.sim.json" -f > "$D/$n.sim.txt" 2>&1; rc=$?
  k=$(grep ': [0-9]* cycles' "$D/$n.sim.txt" | tr -s ' ' | cut -c1-100 | paste -sd';')
  echo "$n: exit $rc in $((SECONDS - t0)) s:$k; $(grep -m1 -E '^(OK|FAILED|MISMATCH|DIFFERENT|CLOSE|ERROR|cudasnap: error)' "$D/$n.sim.txt" | cut -c1-160)"
done
python3 "$ROOT/bench/sim_kernels.py" merge "$D" "$D/all.gpu.json" "$D/all.sim.json" && \
  cudasnap compare "$D/all.gpu.json" "$D/all.sim.json" --html "$D/correlation.html" --top 100
