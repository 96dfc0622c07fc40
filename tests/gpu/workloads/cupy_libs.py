"""CuPy across the CUDA libraries: cuRAND (RandomState: the host generator API; default_rng), cuBLAS
(float32/float64/float16 GEMM, strided batched GEMM), cuFFT (fft, rfft2/irfft2), cuSPARSE (CSR
SpMV, SpMM, SpGEMM, transpose), cuSOLVER (eigh, svd, solve, cholesky, qr) and NVRTC-compiled
kernels (RawKernel, RawModule with template name expressions, ElementwiseKernel,
ReductionKernel), some on a non-blocking stream.

Digests where the result is bit-for-bit reproducible (random numbers, GEMM, FFT, integer-valued
sparse products, integer kernels); cuSOLVER results as a few significant digits and checks."""
import hashlib

import numpy as np
import cupy as cp
import cupyx.scipy.sparse as sparse


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(cp.asnumpy(a)).tobytes()).hexdigest()[:24]


def sig(x, n=6):
    return f"{float(x):.{n}g}"


# cuRAND host API (curandGenerate*)
rs = cp.random.RandomState(seed=1234)
u = rs.random_sample(1 << 16, dtype=cp.float32)
nrm = rs.standard_normal((256, 256), dtype=cp.float32)
ints = rs.randint(0, 1000, size=4096)
print("curand", digest(u), digest(nrm), int(ints.sum()))
try:  # Generator API (XORWOW bit generator: cuRAND device functions in an NVRTC-compiled kernel)
    gen = cp.random.default_rng(42)
    print("curand generator", digest(gen.random(4096, dtype=cp.float32)), digest(gen.standard_normal(1024)))
except Exception as e:  # same outcome natively and under capture: reported, not fatal
    print("curand generator unavailable", type(e).__name__)

# cuBLAS
a32 = rs.standard_normal((256, 384), dtype=cp.float32)
b32 = rs.standard_normal((384, 128), dtype=cp.float32)
a64 = a32.astype(cp.float64)
b64 = b32.astype(cp.float64)
c32 = a32 @ b32
c64 = cp.dot(a64, b64)
c16 = a32.astype(cp.float16) @ b32.astype(cp.float16)
batch = cp.matmul(nrm.reshape(16, 64, 64), nrm.reshape(16, 64, 64).transpose(0, 2, 1))
print("cublas", digest(c32), digest(c64), digest(c16), digest(batch))

# cuFFT
sig_c = (u[:8192] + 1j * u[8192:16384]).astype(cp.complex64)
f1 = cp.fft.fft(sig_c)
img = nrm[:, :200].copy()
f2 = cp.fft.rfft2(img)
back = cp.fft.irfft2(f2, s=img.shape)
print("cufft", digest(f1), digest(f2), "roundtrip_ok", bool(float(cp.abs(back - img).max()) < 1e-4))

# cuSPARSE, integer-valued data: every sum is exact whatever the order
A = sparse.random(512, 512, density=0.02, format="csr", dtype=cp.float32, random_state=7)
A.data = cp.rint(A.data * 8.0) - 4.0
xv = cp.asarray(np.arange(512, dtype=np.float32) % 7 - 3)
B = cp.asarray((np.arange(512 * 64, dtype=np.float32) % 5 - 2).reshape(512, 64))
spmv = A @ xv
spmm = A @ B
spgemm = (A @ A.T).tocsr()
at = A.T.tocsr()
print("cusparse nnz", int(A.nnz), "spmv", digest(spmv), int(spmv.sum()), "spmm", digest(spmm), int(spmm.sum()),
      "spgemm", digest(spgemm.toarray()), int(spgemm.sum()), "transpose", digest(at.toarray()))

# cuSOLVER (float64; printed to a few digits)
M = rs.standard_normal((128, 128), dtype=cp.float64)
S = M @ M.T + 128.0 * cp.eye(128)
w, V = cp.linalg.eigh(S)
sv = cp.linalg.svd(M, compute_uv=False)
rhs = rs.standard_normal((128, 4), dtype=cp.float64)
sol = cp.linalg.solve(S, rhs)
L = cp.linalg.cholesky(S)
q, r = cp.linalg.qr(M)
print("cusolver eig", sig(w.min()), sig(w.max()), sig(w.sum()),
      "svd", sig(sv.max()), sig(sv.sum()),
      "solve_ok", bool(float(cp.abs(S @ sol - rhs).max()) < 1e-8),
      "chol_ok", bool(float(cp.abs(L @ L.T - S).max()) < 1e-8),
      "qr_ok", bool(float(cp.abs(q @ r - M).max()) < 1e-8),
      "eigvec_ok", bool(float(cp.abs(S @ V - V * w).max()) < 1e-7))

# NVRTC-compiled kernels
raw = cp.RawKernel(r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) y[i] = a * x[i] + 1.0f; }''', "scale")
x = u.copy()
y = cp.empty_like(x)
for _ in range(5):
    raw(((x.size + 255) // 256,), (256,), (x, y, cp.float32(0.5), cp.int32(x.size)))
    x, y = y, x
mod = cp.RawModule(code=r'''
template <typename T> __global__ void axpy(const T* x, T* y, T a, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }
extern "C" __global__ void mixu(unsigned int* out, unsigned int k, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x;
  if (i < n) { unsigned int v = (unsigned int)i * 2654435761u + k; out[i] = v ^ (v >> 13); } }
''', options=("-std=c++17",), name_expressions=("axpy<float>", "axpy<double>"))
yf = cp.ones(4096, dtype=cp.float32)
yd = cp.ones(4096, dtype=cp.float64)
mod.get_function("axpy<float>")((16,), (256,), (cp.arange(4096, dtype=cp.float32), yf, cp.float32(0.25), cp.int32(4096)))
mod.get_function("axpy<double>")((16,), (256,), (cp.arange(4096, dtype=cp.float64), yd, cp.float64(0.25), cp.int32(4096)))
mixed = cp.empty(1 << 15, dtype=cp.uint32)
mod.get_function("mixu")((128,), (256,), (mixed, cp.uint32(12345), cp.int32(mixed.size)))
fma = cp.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a * b + 2.0f", "stress_fma")
sq = cp.ReductionKernel("uint32 x", "uint64 s", "(unsigned long long)(x & 1023u)", "a + b", "s = a", "0",
                        "stress_sum")
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    e = fma(x, y)
    total = sq(mixed)
    e2 = cp.cumsum(mixed.astype(cp.uint64))
stream.synchronize()
print("nvrtc", digest(x), digest(yf), digest(yd), digest(mixed), digest(e), int(total), int(e2[-1]))
cp.cuda.Device().synchronize()
