"""CuPy's JIT kernels on small arrays, for simulator replay: run with CUPY_COMPILE_WITH_PTX=1
(CuPy then hands the driver PTX instead of a cubin) and CUPY_ACCELERATORS= (its own reduction
kernels, not CUB's SASS). Element-wise ufuncs, a RawKernel, an ElementwiseKernel, a
ReductionKernel and CuPy's own reductions: each is a kernel NVRTC compiles at run time."""
import hashlib
import cupy as cp

n = 1 << 15
rs = cp.random.RandomState(0)
x = rs.standard_normal(n, dtype=cp.float32)
y = rs.standard_normal(n, dtype=cp.float32)
raw = cp.RawKernel(r'''
extern "C" __global__ void scale_add(const float* x, const float* y, float* out, float a, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) out[i] = a * x[i] + y[i]; }''', "scale_add")
fma = cp.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a * b + 2.0f", "sim_fma")
l2 = cp.ReductionKernel("float32 v", "float32 s", "v * v", "a + b", "s = sqrt(a)", "0", "sim_l2norm")
out = cp.empty_like(x)
for _ in range(3):
    raw(((n + 255) // 256,), (256,), (x, y, out, cp.float32(0.5), cp.int32(n)))
res = [out, fma(x, y), l2(x), cp.exp(x) - y, cp.sqrt(cp.abs(x)) * 3, cp.maximum(x, y), x.sum(), y.max(),
       cp.cumsum(x[:1024]), (x > y).astype(cp.int32), cp.sin(x) + cp.cos(y)]
h = hashlib.sha256(b"".join(cp.asnumpy(r).tobytes() for r in res))
print("sha256", h.hexdigest())
