"""Launch-bound PyTorch loop: many tiny elementwise ops.
    python torch_loop.py [N] [REPS]
Prints LOOP_S, the best wall time of REPS timed loops of N iterations (2 launches each)."""
import sys, time
import torch
n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
x = torch.ones(16, device="cuda")
for _ in range(100):
    x = x * 1.0001 + 0.0001
torch.cuda.synchronize()
best = float("inf")
for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(n):
        x = x * 1.0001 + 0.0001
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
print(f"LOOP_S {best:.4f} for {2 * n} launches")
