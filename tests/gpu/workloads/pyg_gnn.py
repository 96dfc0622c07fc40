"""PyTorch Geometric: a two-layer GCN and a GAT on a random graph (scatter and segment
reductions, sparse message passing), a few training steps and an eval pass."""
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv

torch.manual_seed(0)
dev = "cuda"
n, e, feat, classes = 2000, 16000, 32, 5
x = torch.randn(n, feat, device=dev)
edge_index = torch.randint(0, n, (2, e), device=dev)
y = torch.randint(0, classes, (n,), device=dev)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = GCNConv(feat, 64)
        self.c2 = GATConv(64, classes, heads=2, concat=False)

    def forward(self, x, ei):
        return self.c2(F.relu(self.c1(x, ei)), ei)


model = Net().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(4):
    opt.zero_grad()
    loss = F.cross_entropy(model(x, edge_index), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.2f}")
model.eval()
with torch.no_grad():
    acc = (model(x, edge_index).argmax(1) == y).float().mean().item()
print(f"accuracy {acc:.2f}")
