"""A 2-rank PyTorch DDP training loop (NCCL all-reduce): run with torchrun --nproc-per-node 2.
argv[1]: steps (default 5). Each rank prints its loss and parameter sum in one write."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dist.init_process_group("nccl")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
ddp = DDP(model, device_ids=[local])
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
g = torch.Generator(device="cuda").manual_seed(rank)
x = torch.randn(256, 1024, device="cuda", generator=g)
y = torch.randint(0, 10, (256,), device="cuda", generator=g)
for step in range(steps):
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
s = sum(float(p.double().sum()) for p in model.parameters())
sys.stdout.write(f"rank {rank} loss {float(loss):.6f} params {s:.6f}\n")
sys.stdout.flush()
dist.destroy_process_group()
if os.environ.get("WORKLOAD_EXIT_ABRUPTLY"):      # end without exit handlers (a flight-recorder trigger)
    os._exit(0)
