"""PyTorch across the CUDA libraries in one process: random numbers (Philox, cuRAND device
functions), cuBLAS/cuBLASLt (fp32 GEMM, fp16 addmm and bf16 linear with bias, batched GEMM, fp8
scaled GEMM where this build has it), cuDNN (conv2d forward + backward, batch norm, deterministic
algorithms), cuFFT, cuSOLVER (svd, eigh, cholesky, solve, qr), cuSPARSE (COO and CSR SpMM, SpMV,
sparse x sparse) and NCCL (a one-rank process group: all_reduce, broadcast, all_gather).

Digests where the result is bit-for-bit reproducible; cuSOLVER results as a few significant
digits and checks; sparse products on integer-valued data (exact whatever the order)."""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.preferred_linalg_library("cusolver")
dev = "cuda"


def digest(t):
    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return hashlib.sha256(t.contiguous().cpu().numpy().tobytes()).hexdigest()[:24]


def sig(x, n=6):
    return f"{float(x):.{n}g}"


def approx(t, n=4):
    """Magnitude (sum of |t|) to n significant digits and balance (sum / sum of |t|) to 3
    decimals: stable under reordered float sums, unlike a bare sum that may cancel to ~0."""
    t = t.detach().double()
    mag = float(t.abs().sum())
    return f"{sig(mag, n)}/{round(float(t.sum()) / mag, 3) if mag else 0.0}"


# random numbers
r1 = torch.randn(256, 512, device=dev)
r2 = torch.rand(512, 128, device=dev)
ri = torch.randint(0, 1000, (4096,), device=dev)
print("rand", digest(r1), digest(r2), int(ri.sum()))

# cuBLAS / cuBLASLt
c32 = r1 @ r2
a16, b16 = r1.half(), r2.half()
bias16 = torch.linspace(-1, 1, 128, device=dev).half()
c16 = torch.addmm(bias16, a16, b16)
w_bf = r2.t().contiguous().bfloat16()
lin_bf = F.linear(r1.bfloat16(), w_bf, bias16.bfloat16())
bmm = torch.bmm(r1.view(8, 32, 512).half(), r1.view(8, 32, 512).transpose(1, 2).half())
print("cublas", digest(c32), digest(c16), digest(lin_bf), digest(bmm))
try:  # fp8 GEMM through cuBLASLt (sm_89+); the private API's signature has moved between releases
    a8 = r1[:, :256].to(torch.float8_e4m3fn)
    b8 = r2[:256, :].t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    f8 = torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    f8 = f8[0] if isinstance(f8, tuple) else f8
    print("cublaslt fp8", digest(f8))
except Exception as e:  # same outcome natively and under capture: reported, not fatal
    print("cublaslt fp8 unavailable", type(e).__name__)

# cuDNN: conv2d forward + backward, batch norm
x = torch.randn(8, 3, 32, 32, device=dev, requires_grad=True)
w = torch.randn(16, 3, 3, 3, device=dev, requires_grad=True)
b = torch.zeros(16, device=dev, requires_grad=True)
y = F.conv2d(x, w, b, padding=1)
bn = torch.nn.BatchNorm2d(16).to(dev)
z = F.conv2d(F.relu(bn(y)), w.transpose(0, 1).flip(2, 3).contiguous(), padding=1)
loss = z.square().mean()
loss.backward()
# batch norm reduces across the batch, so what follows it is printed to 4 significant digits
print("cudnn conv", digest(y), "after bn", approx(z), "loss", sig(loss.item(), 4), "grads", approx(x.grad),
      approx(w.grad), approx(b.grad))

# cuFFT
sig_c = torch.complex(r1[0], r1[1])
f1 = torch.fft.fft(sig_c)
f2 = torch.fft.rfft2(r1[:64, :64])
back = torch.fft.irfft(torch.fft.rfft(r1[2]), n=512)
print("cufft", digest(torch.view_as_real(f1)), digest(torch.view_as_real(f2)),
      "roundtrip_ok", bool((back - r1[2]).abs().max().item() < 1e-4))

# cuSOLVER (float64; printed to a few digits)
M = torch.randn(96, 96, device=dev, dtype=torch.float64)
S = M @ M.T + 96.0 * torch.eye(96, device=dev, dtype=torch.float64)
U, sv, Vh = torch.linalg.svd(M)
evals, evecs = torch.linalg.eigh(S)
L = torch.linalg.cholesky(S)
rhs = torch.randn(96, 3, device=dev, dtype=torch.float64)
sol = torch.linalg.solve(S, rhs)
Q, R = torch.linalg.qr(M)
print("cusolver svd", sig(sv.max()), sig(sv.sum()), "eig", sig(evals.min()), sig(evals.max()),
      "svd_ok", bool(((U * sv) @ Vh - M).abs().max().item() < 1e-8),
      "chol_ok", bool((L @ L.T - S).abs().max().item() < 1e-8),
      "solve_ok", bool((S @ sol - rhs).abs().max().item() < 1e-8),
      "qr_ok", bool((Q @ R - M).abs().max().item() < 1e-8),
      "eigvec_ok", bool((S @ evecs - evecs * evals).abs().max().item() < 1e-7))

# cuSPARSE on integer-valued data
g = torch.Generator(device=dev)
g.manual_seed(5)
idx = torch.randint(0, 512, (2, 6000), device=dev, generator=g)
vals = torch.randint(-3, 4, (6000,), device=dev, generator=g).float()
sp = torch.sparse_coo_tensor(idx, vals, (512, 512)).coalesce()
dense = (torch.arange(512 * 32, device=dev) % 5 - 2).float().view(512, 32)
vec = (torch.arange(512, device=dev) % 7 - 3).float()
coo_mm = torch.sparse.mm(sp, dense)
csr = sp.to_sparse_csr()
csr_mm = csr @ dense
csr_mv = torch.mv(csr, vec)
spsp = torch.sparse.mm(sp, sp).to_dense()
print("cusparse nnz", int(sp._nnz()), "coo_mm", digest(coo_mm), int(coo_mm.sum().item()), "csr_mm", digest(csr_mm),
      "csr_mv", digest(csr_mv), int(csr_mv.sum().item()), "spgemm", digest(spsp), int(spsp.sum().item()))

# NCCL: a process group of one rank
import torch.distributed as dist  # noqa: E402

if dist.is_available() and dist.is_nccl_available():
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    store_dir = tempfile.mkdtemp(prefix="torch_libs_store_")
    try:
        dist.init_process_group("nccl", init_method="file://" + os.path.join(store_dir, "store"), rank=0,
                                world_size=1)
        t = torch.arange(4096, device=dev, dtype=torch.float32)
        dist.all_reduce(t)
        avg = t.clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        mx = torch.randn(1000, device=dev)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        dist.broadcast(t, src=0)
        out = torch.empty(4096 * dist.get_world_size(), device=dev)
        dist.all_gather_into_tensor(out, t)
        torch.cuda.synchronize()
        print("nccl world", dist.get_world_size(), digest(t), digest(avg), digest(mx), digest(out),
              "gather_ok", bool(torch.equal(out, t)))
        dist.destroy_process_group()
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
else:
    print("nccl unavailable")
torch.cuda.synchronize()
