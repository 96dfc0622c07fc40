"""A small PyTorch training loop for the extract demo: an MLP trained with AdamW on fixed
data, each step inside an NVTX range "step N" (so a step's calls can be found in the snapshot).
Usage: python3 demo_torch_train.py [STEPS] [WIDTH] [LAYERS]"""
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
width = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 8
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(256, width).cuda(), torch.randn(256, width).cuda()
for step in range(steps):
    torch.cuda.nvtx.range_push(f"step {step}")
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"step {step} loss {loss.item():.5f}")
