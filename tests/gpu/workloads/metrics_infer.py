"""A cuBLAS-heavy inference (for `--profile metrics` against ncu): an fp16 MLP of 4 layers of
4096 x 4096 under torch.inference_mode, batch 2048, 3 forward passes; GEMMs of ~0.5 ms each
(cuBLAS/cuBLASLt tensor-core kernels) with GELU between them."""
import torch

torch.manual_seed(0)
dev = "cuda"
layers = [torch.nn.Linear(4096, 4096, dtype=torch.float16, device=dev) for _ in range(4)]
x = torch.randn(2048, 4096, dtype=torch.float16, device=dev)
with torch.inference_mode():
    for _ in range(3):
        h = x
        for lin in layers:
            h = torch.nn.functional.gelu(lin(h))
torch.cuda.synchronize()
print("sum", round(float(h.float().abs().mean()), 4))
