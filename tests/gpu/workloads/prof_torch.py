"""Profiling workload (PyTorch): kernels long enough (>= 20 us) to compare times."""
import torch
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
a = torch.randn(2048, 2048, device=dev)
b = torch.randn(2048, 2048, device=dev)
x = torch.randn(32 << 20, device=dev)
for _ in range(10):
    c = a @ b
    y = torch.tanh(x) * 0.5 + x
    a = c / c.norm()
torch.cuda.synchronize()
print("sum", round(float(a.sum()), 3), round(float(y[:1000].sum()), 3))
