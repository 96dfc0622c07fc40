"""torchvision ResNet-18 training steps in channels_last with automatic mixed precision (bf16
autocast) and fused AdamW, then an eval pass; cuDNN deterministic, no benchmark search."""
import torch
import torchvision

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
dev = "cuda"
model = torchvision.models.resnet18(num_classes=10).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
x = torch.randn(16, 3, 64, 64, device=dev).to(memory_format=torch.channels_last)
y = torch.randint(0, 10, (16,), device=dev)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.3f}")
model.eval()
with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
    pred = model(x).argmax(1)
print("pred", pred.tolist())
