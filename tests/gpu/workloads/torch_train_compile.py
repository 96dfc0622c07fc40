"""PyTorch training three ways, a few steps each, losses printed rounded:

1. torch.compile (Inductor: Triton kernels for forward and, through AOTAutograd, backward),
   SGD with momentum;
2. torch.compile(mode="reduce-overhead"): the same compiled code run as CUDA graphs (cudagraph
   trees, forward and backward), Adam;
3. a whole training step (forward, backward, optimizer) captured by hand into one
   torch.cuda.CUDAGraph after warm-up on a side stream, then replayed on new batches.

torch_compile.py (forward only) and torch_graph.py (inference graph) cover the simpler cases."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.use_deterministic_algorithms(True, warn_only=True)
dev = "cuda"


def make(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10)).to(dev)


def batches(seed, n):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return [(torch.randn(64, 128, device=dev, generator=g), torch.randint(0, 10, (64,), device=dev, generator=g))
            for _ in range(n)]


def param_sum(model):
    return round(float(sum(p.detach().double().sum() for p in model.parameters())), 3)


# 1. compiled forward + backward, eager optimizer
m1 = make(1)
c1 = torch.compile(m1)
opt1 = torch.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9)
losses = []
for x, y in batches(10, 5):
    opt1.zero_grad(set_to_none=True)
    loss = F.cross_entropy(c1(x), y)
    loss.backward()
    opt1.step()
    losses.append(round(loss.item(), 4))
print("compile losses", losses, "params", param_sum(m1))

# 2. compiled with CUDA graphs (cudagraph trees)
m2 = make(2)


def fwd_loss(x, y):
    return F.cross_entropy(m2(x), y)


c2 = torch.compile(fwd_loss, mode="reduce-overhead")
opt2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
losses = []
for x, y in batches(20, 6):
    torch.compiler.cudagraph_mark_step_begin()
    opt2.zero_grad(set_to_none=True)
    loss = c2(x, y)
    loss.backward()
    opt2.step()
    losses.append(round(loss.item(), 4))
print("reduce-overhead losses", losses, "params", param_sum(m2))

# 3. whole training step in one CUDA graph
m3 = make(3)
opt3 = torch.optim.SGD(m3.parameters(), lr=0.05, momentum=0.9)
data = batches(30, 7)
static_x = data[0][0].clone()
static_y = data[0][1].clone()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        opt3.zero_grad(set_to_none=True)
        F.cross_entropy(m3(static_x), static_y).backward()
        opt3.step()
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
opt3.zero_grad(set_to_none=True)
with torch.cuda.graph(g):
    static_loss = F.cross_entropy(m3(static_x), static_y)
    static_loss.backward()
    opt3.step()
losses = []
for x, y in data[1:]:
    static_x.copy_(x)
    static_y.copy_(y)
    g.replay()
    losses.append(round(static_loss.item(), 4))
print("graph losses", losses, "params", param_sum(m3))
