"""CuPy: a RawKernel plus library routines (cuBLAS matmul, cuFFT)."""
import hashlib
import cupy as cp
k = cp.RawKernel(r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) y[i] = a * x[i] + 1.0f; }''', "scale")
rs = cp.random.RandomState(0)
x = rs.standard_normal(1 << 16, dtype=cp.float32); y = cp.empty_like(x)
for _ in range(5):
    k(((x.size + 255) // 256,), (256,), (x, y, cp.float32(0.5), cp.int32(x.size)))
    x, y = y, x
m = rs.standard_normal((256, 256), dtype=cp.float32)
p = m @ m.T
f = cp.fft.fft(x[:4096])
h = hashlib.sha256(cp.asnumpy(x).tobytes() + cp.asnumpy(p).tobytes() + cp.asnumpy(f).tobytes())
print("sha256", h.hexdigest())
