#!/usr/bin/env bash
# CPU half of bench/numerics_gpu.sh: replays its float-kernel extracts (numerics_sim.tar.xz,
# unpacked into DIR) on GPGPU-Sim, functional mode, and prints each one's numerics: EXACT, or
# CLOSE with the element type, elements differing, max abs/rel error and ULPs, or DIFFERENT.
#   CUDASNAP_GPGPUSIM=/path/to/gpgpu-sim bash bench/numerics_sim_cpu.sh DIR [CONFIG]
set -uo pipefail
D=$(cd "${1:?usage: numerics_sim_cpu.sh DIR [CONFIG]}" && pwd); CFG=${2:+:$2}
: "${CUDASNAP_GPGPUSIM:?set CUDASNAP_GPGPUSIM to the GPGPU-Sim build}"
W=$(mktemp -d); n_ok=0; n=0
for x in "$D"/sim_num_*.x.cusnap; do
  name=$(basename "$x" .x.cusnap); n=$((n + 1)); t0=$SECONDS
  cudasnap replay "$x" --sim "gpgpu-sim$CFG" > "$W/$name.txt" 2>&1; rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s: $(tail -1 "$W/$name.txt")"
  grep -E '^(numerics|D2H results|CLOSE|DIFFERENT):' "$W/$name.txt" | cut -c1-300 | sed 's/^/  /'
  grep -q '^D2H results: ' "$W/$name.txt" && [ $rc -le 1 ] && n_ok=$((n_ok + 1))
done
echo "$n_ok of $n extracts judged (EXACT, CLOSE or DIFFERENT with numbers; none a bare mismatch)"
rm -rf "$W"
