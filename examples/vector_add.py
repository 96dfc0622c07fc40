"""The bundled example workload: a vector add through the CUDA Driver API (cuda-python),
from PTX JIT-compiled by the driver. `examples/run.sh` captures and replays it."""
import sys

import numpy as np
from cuda.bindings import driver as cu

PTX = rb"""
.version 7.0
.target sm_52
.address_size 64
.visible .entry vadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)
{
  .reg .pred p; .reg .b32 r<6>; .reg .f32 f<4>; .reg .b64 rd<11>;
  ld.param.u64 rd1, [a]; ld.param.u64 rd2, [b]; ld.param.u64 rd3, [c]; ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x; mov.u32 r3, %ntid.x; mov.u32 r4, %tid.x;
  mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1;
  @p bra DONE;
  cvta.to.global.u64 rd4, rd1; cvta.to.global.u64 rd5, rd2; cvta.to.global.u64 rd6, rd3;
  mul.wide.u32 rd7, r5, 4;
  add.s64 rd8, rd4, rd7; add.s64 rd9, rd5, rd7; add.s64 rd10, rd6, rd7;
  ld.global.f32 f1, [rd8]; ld.global.f32 f2, [rd9];
  add.f32 f3, f1, f2;
  st.global.f32 [rd10], f3;
DONE:
  ret;
}
"""


def check(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != cu.CUresult.CUDA_SUCCESS:
        sys.exit(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def main():
    n = 1 << 18
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    mod = check(cu.cuModuleLoadData(PTX + b"\0"))
    fn = check(cu.cuModuleGetFunction(mod, b"vadd"))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    da, db, dc = (check(cu.cuMemAlloc(4 * n)) for _ in range(3))
    check(cu.cuMemcpyHtoD(da, a.ctypes.data, 4 * n))
    check(cu.cuMemcpyHtoD(db, b.ctypes.data, 4 * n))
    args = [np.array([int(da)], np.uint64), np.array([int(db)], np.uint64), np.array([int(dc)], np.uint64),
            np.array([n], np.uint32)]
    ptrs = np.array([x.ctypes.data for x in args], np.uint64)
    for _ in range(10):
        check(cu.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, 0, ptrs.ctypes.data, 0))
    c = np.empty(n, np.float32)
    check(cu.cuMemcpyDtoH(c.ctypes.data, dc, 4 * n))
    ok = np.array_equal(c, a + b)
    print(f"vector_add: {n} elements, 10 launches, result {'correct' if ok else 'WRONG'}")
    for p in (da, db, dc):
        check(cu.cuMemFree(p))
    check(cu.cuDevicePrimaryCtxRelease(dev))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
