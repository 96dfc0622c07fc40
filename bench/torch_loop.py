"""Launch-bound PyTorch loop: many tiny elementwise ops. Prints wall seconds of the loop."""
import sys, time
import torch
n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
x = torch.ones(16, device="cuda")
for _ in range(100):
    x = x * 1.0001 + 0.0001
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(n):
    x = x * 1.0001 + 0.0001
torch.cuda.synchronize()
print(f"LOOP_S {time.perf_counter() - t0:.4f} for {2 * n} launches")
