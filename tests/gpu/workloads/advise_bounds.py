"""Two kernels the advisor must tell apart by their counters (tests/gpu/test_gpu_advise.py): an
elementwise fp32 kernel over 256 MiB (y = x * 2 + 1: one read and one write a value, far beyond
L2, so it runs at the memory's speed) and an fp16 GEMM of 8192 x 8192 x 8192 on tensor cores
(about 1.1 TFLOP, compute-bound), each run twice."""
import torch

torch.manual_seed(0)
x = torch.randn(64 << 20, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
for _ in range(2):
    y = x * 2 + 1
    c = a @ b
torch.cuda.synchronize()
print("sums", round(float(y[:1024].sum()), 3), round(float(c[:8, :8].float().abs().sum()), 1))
