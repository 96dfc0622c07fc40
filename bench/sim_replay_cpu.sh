#!/usr/bin/env bash
# CPU half of the simulator demonstration: replays the extracts that bench/sim_capture_gpu.sh
# made on a GPU (unpacked into DIR) on GPGPU-Sim, functional and performance mode, in each
# config the build ships, and compares the simulated profile with the GPU's timeline profile.
#   CUDASNAP_GPGPUSIM=/path/to/gpgpu-sim bash bench/sim_replay_cpu.sh DIR
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); D=$(cd "${1:?usage: sim_replay_cpu.sh DIR}" && pwd)
SIM=${CUDASNAP_GPGPUSIM:?set CUDASNAP_GPGPUSIM to the GPGPU-Sim build}
W=$(mktemp -d); cd "$W"
# PyTorch's kernel ships as SASS only: its extract is refused by name, then runs with a PTX build
K=$(grep -o '_ZN2at6native29vectorized_elementwise_kernel[A-Za-z0-9_]*MulFunctor[A-Za-z0-9_]*' "$D/sim_torch.launches.txt" 2>/dev/null | head -1)
if [ -n "$K" ]; then
  cudasnap replay "$D/sim_torch.x.cusnap" --sim gpgpu-sim 2>&1 | tail -1 | cut -c1-160
  nvcc -ptx -arch=compute_75 --expt-relaxed-constexpr "$ROOT/bench/sim_torch_mul.cu" -o mul.ptx 2>/dev/null || cp "$D/sim_torch_mul.ptx" mul.ptx
fi
for x in "$D"/sim_*.x.cusnap; do
  n=$(basename "$x" .x.cusnap); extra=()
  [ "$n" = sim_torch ] && extra=(--replace "$K=$W/mul.ptx")
  t0=$SECONDS; cudasnap replay "$x" --sim gpgpu-sim "${extra[@]}" > "$n.func.txt" 2>&1; rc=$?
  echo "$n functional: exit $rc in $((SECONDS - t0)) s: $(tail -1 "$n.func.txt")"
  for c in $(ls "$SIM/configs"); do
    t0=$SECONDS
    cudasnap replay "$x" --sim "gpgpu-sim:$c" --sim-mode performance --out "$n.$c.json" -f "${extra[@]}" > "$n.$c.txt" 2>&1; rc=$?
    cyc=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('; '.join(f\"{k['name'][:40]} {k.get('cycles','?')} cycles {k.get('median_us', k.get('total_us','?'))} us\" for k in d.get('kernels',[])))" "$n.$c.json" 2>/dev/null)
    echo "  $c performance: exit $rc in $((SECONDS - t0)) s: $cyc"
  done
  [ -f "$D/$n.x.gpu.json" ] && cudasnap compare "$D/$n.x.gpu.json" "$n.$(ls "$SIM/configs" | head -1).json" 2>&1 | tail -3
done
rm -rf "$W"
