"""A small bf16 GPT trained with AdamW (about 250 launches a step), one step per
torch.cuda.synchronize(), timed in-process: the training-loop row of bench/bench_replay_gpu.py.

    python gpt_step.py eager [STEPS]   the eager loop (captured and replayed by the bench)
    python gpt_step.py graph [STEPS]   the same step captured once as a CUDA graph and replayed
                                       (the GPU-bound time; AdamW capturable=True there)
Prints `step_ms <median of steps 10..STEPS>` and `STEPS <n>`; the eager loop's per-step
synchronize is a cuCtxSynchronize, the step boundary replay times (result's sync_mono); two
synchronizations in a row, with no launch or memory call between them, open the loop."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
torch.manual_seed(0)
dev = "cuda"
V, D, H, L, T, B = 512, 256, 4, 2, 128, 16


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2)) * (D // H) ** -0.5
        a = a.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(V, D), torch.nn.Embedding(T, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, V, bias=False)

    def forward(self, idx, mask):
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=(mode == "graph"))
mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)
data = torch.randint(0, V, (B, T + 1), device=dev)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=(mode != "graph")):
        logits = model(data[:, :-1], mask)
    loss = F.cross_entropy(logits.float().view(-1, V), data[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=(mode != "graph"))
    loss.backward()
    opt.step()
    return loss


run = step
if mode == "graph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step()
    run = g.replay
torch.cuda.synchronize()
torch.cuda.synchronize()        # two in a row: marks the loop's start in the snapshot
times = []
for i in range(steps):
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(f"step_ms {statistics.median(times[10:] or times) * 1e3:.4f}")
print(f"STEPS {steps}")
