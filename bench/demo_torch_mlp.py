"""A PyTorch program for the export/extract demo: weights made on the host and uploaded (as a
program loading a checkpoint does), then a stack of fp32 linear layers (cuBLAS GEMMs).
Usage: python3 demo_torch_mlp.py [LAYERS] [WIDTH]"""
import sys

import torch

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
width = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
torch.manual_seed(0)
weights = [(torch.randn(width, width) / width ** 0.5).cuda() for _ in range(layers)]
x = torch.randn(64, width).cuda()
for w in weights:
    x = torch.relu(x @ w)
torch.cuda.synchronize()
print(f"layers {layers} width {width} checksum {float(x.double().sum()):.6e}")
