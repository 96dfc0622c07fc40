#!/usr/bin/env bash
# Quick diagnosis on the GPU machine: install (as gpu_suite.sh does), capture two small
# programs and print what the snapshot says. Usage: bash bench/diag/diag_gpu.sh
set -uo pipefail
SKIP_SUITE=1 SKIP_BENCH=1 bash bench/gpu_suite.sh > /dev/null
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
ROOT=$(pwd); OUT=${OUT:-/tmp/cudasnap-out}; W=/tmp/diag; mkdir -p $W; cd $W
nvcc -O2 -arch=sm_90 -cudart static -o ptrs "$ROOT/tests/gpu/workloads/ptrs.cu"
python3 -m cudasnap capture -f -o ptrs.cusnap -- ./ptrs | tail -2
python3 -m cudasnap dump ptrs.cusnap --calls cuMemAlloc | head -5
python3 -m cudasnap dump ptrs.cusnap --format jsonl | grep -i placement | head -3
python3 -m cudasnap replay ptrs.cusnap | tail -4
python3 -m cudasnap capture -f -o loop.cusnap -- python3 "$ROOT/bench/torch_loop.py" 5000
python3 -m cudasnap info loop.cusnap --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['calls']['total'], sorted(d['calls']['by_name'].items(), key=lambda kv: -kv[1])[:14])"
python3 "$ROOT/bench/torch_loop.py" 5000
