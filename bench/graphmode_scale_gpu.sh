#!/usr/bin/env bash
# Graph mode's wall time against timeline mode's on real training loops (GPU machine).
# Captures the bf16 GPT loop of tests/gpu/workloads/prof_gpt_train.py (60 steps: ~20,000
# launches) and the same model with cuDNN attention (SDPA, 60 steps: ~9,000 launches), then
# bench/bench_graphmode_scale.py replays each under --profile timeline and --profile graph
# (default options: graph mode's timeline check included), ROUNDS times alternating.
# Writes $OUT/graphmode_scale.json and $OUT/graphmode_scale.txt; a graph replay that does not
# finish within GRAPH_LIMIT seconds fails the row (the earlier deadlock).
# Run from the project root (carry .whl):  bash bench/graphmode_scale_gpu.sh
set -uo pipefail
ROOT=$(pwd); export CUDASNAP_ROOT=$ROOT
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
INSTALL_LOG=$OUT/install.log . "$ROOT/bench/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
W=/tmp/graphscale; mkdir -p $W; cd $W
cat > sdpa_loop.py <<'EOF'
"""prof_gpt_train's GPT with cuDNN attention (scaled_dot_product_attention), bf16, AdamW."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, sys.argv[2])
import prof_gpt_train as g


def forward(self, x, mask):
    q, k, v = self.qkv(self.ln1(x)).view(g.B, g.T, 3, g.H, g.D // g.H).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(a.transpose(1, 2).reshape(g.B, g.T, g.D))
    return x + self.out(F.gelu(self.fc(self.ln2(x))))


g.Block.forward = forward
step = g.make_step()
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
    for i in range(int(sys.argv[1])):
        loss = step()
print(f"loss {loss.item():.4f}")
EOF
WL=$ROOT/tests/gpu/workloads
python3 -m cudasnap capture -q -f -o gpt_train.cusnap -- python3 $WL/prof_gpt_train.py ${STEPS:-60} | tail -1
python3 -m cudasnap capture -q -f -o gpt_sdpa.cusnap -- python3 sdpa_loop.py ${STEPS:-60} $WL | tail -1
timeout ${GRAPH_LIMIT:-600} python3 "$ROOT/bench/bench_graphmode_scale.py" gpt_sdpa.cusnap gpt_train.cusnap \
  --rounds ${ROUNDS:-2} --timeout ${GRAPH_LIMIT:-600} --json "$OUT/graphmode_scale.json" 2>&1 | tee "$OUT/graphmode_scale.txt"
