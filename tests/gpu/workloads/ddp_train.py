"""A 2-rank PyTorch DDP training loop (NCCL all-reduce): run with torchrun --nproc-per-node N.
argv[1]: steps (default 5). Each rank prints its loss and parameter sum in one write.
DDP_PROFILE=PREFIX: the steps under torch.profiler, each rank's trace to PREFIX.rankR.json.
WORKLOAD_EXIT_ABRUPTLY=1: end through os._exit (no exit handlers)."""
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
prof_out = os.environ.get("DDP_PROFILE")
prof = None
if prof_out:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
for step in range(steps):
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
if prof is not None:
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(f"{prof_out}.rank{rank}.json")
s = sum(float(p.double().sum()) for p in model.parameters())
sys.stdout.write(f"rank {rank} loss {float(loss):.6f} params {s:.6f}\n")   # one write: ranks share stdout
sys.stdout.flush()
dist.destroy_process_group()
if os.environ.get("WORKLOAD_EXIT_ABRUPTLY"):      # end without exit handlers (a flight-recorder trigger)
    os._exit(0)
