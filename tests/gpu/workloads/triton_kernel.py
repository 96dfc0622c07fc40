"""A hand-written Triton kernel, launched a counted number of times."""
import hashlib
import torch, triton, triton.language as tl

@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

torch.manual_seed(0)
n = 1 << 20
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); out = torch.empty_like(x)
for i in range(20):
    axpy[(triton.cdiv(n, 1024),)](x, y, out, 2.0, n, BLOCK=1024)
    y, out = out, y
print("sha256", hashlib.sha256(y.cpu().numpy().tobytes()).hexdigest())
print("TRITON_LAUNCHES 20")
