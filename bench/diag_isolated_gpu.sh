#!/usr/bin/env bash
# Isolated-mode spread on the GPU suite's profiling snapshots, per way of running the repeats:
# L2 flushed by reading (default) or by a memset, not flushed; 10 and 30 repeats. (Runs queued back to back and 1-20 ms of GPU idle
# before each run were tried with it and dropped: README, "Latest figures".)
# Run after gpu_suite.sh (installs the package and makes /tmp/cudasnap-gpu/snaps/prof_*.cusnap).
set -uo pipefail
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
OUT=${OUT:-/tmp/cudasnap-out}; W=/tmp/diag-iso; mkdir -p $W
for snap in prof_torch prof_jax; do
  S=/tmp/cudasnap-gpu/snaps/$snap.cusnap
  [ -f $S ] || { echo "no $S"; continue; }
  for v in "default::--repeat 10" "memsetflush::--repeat 10" "noflush:--no-flush-l2:--repeat 10" "repeat30::--repeat 30"; do
    name=${v%%:*}; rest=${v#*:}; flag=${rest%%:*}; rep=${rest#*:}
    fl=read; [ $name = memsetflush ] && fl=memset
    CUDASNAP_L2_FLUSH=$fl python3 -m cudasnap replay $S --profile isolated $flag $rep --warmup 3 --out $W/$snap.$name.json -q > /dev/null 2>&1
    python3 - "$W/$snap.$name.json" "$snap $name" <<'PY'
import json, statistics, sys
rows = [r for r in json.load(open(sys.argv[1]))["launches"] if r.get("median_us", 0) >= 20]
sp = sorted(r["spread_pct"] for r in rows)
iq = sorted(r.get("iqr_pct", 0) for r in rows)
cv = sorted(statistics.pstdev(r["times_us"]) / statistics.fmean(r["times_us"]) * 100 for r in rows)
worst = max(rows, key=lambda r: r["spread_pct"]) if rows else {}
print(f"{sys.argv[2]:28s} n={len(rows):3d} spread max {sp[-1] if sp else 0:.2f}% median {statistics.median(sp) if sp else 0:.2f}%"
      f" | iqr max {iq[-1] if iq else 0:.2f}% | cv max {cv[-1] if cv else 0:.2f}% | over 3%: {sum(x >= 3 for x in sp)}"
      f" | worst {worst.get('name', '')[:40]} {worst.get('median_us', 0):.1f}us {[round(t, 1) for t in worst.get('times_us', [])][:12]}")
PY
  done
done 2>&1 | tee $OUT/diag_isolated.txt
