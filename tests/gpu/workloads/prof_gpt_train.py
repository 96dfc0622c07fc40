"""Profiling workload (PyTorch): a small bf16 GPT trained for STEPS steps (default 60), eager,
AdamW; about 250 launches a step (>= 10,000 in all), most of them short.  The model (GPT) is
also the training-loop row of bench/gpt_step.py.
    python prof_gpt_train.py [STEPS]"""
import sys
import torch
import torch.nn.functional as F

V, D, H, L, T, B = 512, 256, 4, 2, 128, 16


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2)) * (D // H) ** -0.5
        a = a.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(V, D), torch.nn.Embedding(T, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, V, bias=False)

    def forward(self, idx, mask):
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def make_step(capturable: bool = False):
    """The training step (AdamW, bf16 autocast) on a model seeded with 0; returns the loss.
    capturable: as a CUDA graph can hold it (AdamW capturable=True, no autocast cache, gradients
    zeroed in place), the same kernels eager or in a graph (prof_gpt_graph.py)."""
    torch.manual_seed(0)
    dev = "cuda"
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=capturable)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)
    data = torch.randint(0, V, (B, T + 1), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not capturable):
            logits = model(data[:, :-1], mask)
        loss = F.cross_entropy(logits.float().view(-1, V), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=not capturable)
        loss.backward()
        opt.step()
        return loss
    return step


def main():
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    step = make_step()
    for i in range(steps):
        loss = step()
        if i % 20 == 19 or i == steps - 1:
            print(f"step {i + 1} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
