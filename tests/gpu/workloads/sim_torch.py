"""A small PyTorch program for simulator replay: its kernels ship as SASS only, so a simulator
needs a PTX build of the kernel it replays."""
import torch

x = torch.arange(1 << 14, device="cuda", dtype=torch.float32)
y = x * 3.0
print("torch sum", float(y.sum().item()))
