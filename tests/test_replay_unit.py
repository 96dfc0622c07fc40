"""Driver-free tests of the replayer: planning, placement, relocation, verification, filtering,
exit codes (with an injected fake driver)."""
from __future__ import annotations

import struct
import types

import pytest

from cudasnap.replay import ReplayOptions
from cudasnap.replay.engine import Replayer
from cudasnap.replay.placement import AddressSpace, plan_spans, relocate_params, scan_payload
from synth import Synth
from cudasnap.replay.verify import Tolerance, compare

G = 2 << 20


# ---------------------------------------------------------------------------- fake driver
class _Enum(int):
    def __new__(cls, v=0):
        return int.__new__(cls, int(v))


class _Handle:
    def __init__(self, v=0):
        self.v = int(v)

    def __int__(self):
        return self.v

    def getPtr(self):
        return 0


class _Struct:
    def __init__(self):
        self.location = types.SimpleNamespace(type=0, id=0)


class FakeCU:
    """Just enough of cuda.bindings.driver: memory is Python bytearrays, kernels do nothing
    except `fill(p, v, n)` (writes v to n u32 words)."""

    def __init__(self, occupied=()):
        ns = types.SimpleNamespace
        self.CUdevice_attribute = ns(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                     CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76)
        self.CUmemAllocationType = ns(CU_MEM_ALLOCATION_TYPE_PINNED=1)
        self.CUmemLocationType = ns(CU_MEM_LOCATION_TYPE_DEVICE=1)
        self.CUmemAllocationGranularity_flags = ns(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0)
        self.CUmemAccess_flags = _Enum
        self.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
        self.CUmemAllocationProp = _Struct
        self.CUmemAccessDesc = _Struct
        self.CUcontext = self.CUstream = self.CUfunction = _Handle
        self.reserved = [(a, n) for a, n in occupied]
        self.mapped = {}       # base -> bytearray (VMM mappings and cuMemAlloc blocks)
        self.creates = 0
        self.next_alloc = 0x700000000000
        self.calls = []

    def _ok(self, *v):
        return (0, *v)

    def __getattr__(self, name):  # any unknown driver call: succeed with no outputs
        if name.startswith("cu"):
            return lambda *a: (0,)
        raise AttributeError(name)

    def cuInit(self, f):
        return (0,)

    def cuDeviceGetCount(self):
        return (0, 1)

    def cuDeviceGet(self, i):
        return (0, 0)

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, 9 if attr == 75 else 0)

    def cuMemGetAllocationGranularity(self, prop, flag):
        return (0, G)

    def cuMemAddressReserve(self, size, align, addr, flags):
        if any(a < addr + size and addr < a + n for a, n in self.reserved):
            addr = 0x7F0000000000 + len(self.reserved) * (1 << 32)
        self.reserved.append((addr, size))
        return (0, addr)

    def cuMemAddressFree(self, addr, size):
        self.reserved = [(a, n) for a, n in self.reserved if a != addr]
        return (0,)

    def cuMemCreate(self, size, prop, flags):
        self.creates += 1
        return (0, _Handle(size))

    def cuMemMap(self, addr, size, off, h, flags):
        self.mapped[int(addr)] = bytearray(size)
        return (0,)

    def cuMemUnmap(self, addr, size):
        del self.mapped[int(addr)]
        return (0,)

    def cuMemAlloc(self, size):
        p = self.next_alloc
        self.next_alloc += 1 << 24
        self.mapped[p] = bytearray(size)
        return (0, p)

    def cuMemFree(self, p):
        self.mapped.pop(int(p), None)
        return (0,)

    def _find(self, addr, n):
        for b, buf in self.mapped.items():
            if b <= addr and addr + n <= b + len(buf):
                return buf, addr - b
        raise KeyError(hex(addr))

    def cuMemcpyHtoD(self, dst, data, n):
        buf, o = self._find(int(dst), n)
        buf[o:o + n] = bytes(data)[:n]
        return (0,)

    def cuMemcpyDtoH(self, out, src, n):
        buf, o = self._find(int(src), n)
        out[:n] = buf[o:o + n]
        return (0,)

    def cuDevicePrimaryCtxRetain(self, dev):
        return (0, _Handle(0xC7C))

    def cuCtxGetCurrent(self):
        return (0, _Handle(0xC7C))

    def cuModuleLoadData(self, img):
        return (0, _Handle(0x30D))

    def cuModuleGetFunction(self, mod, name):
        if name not in (b"fill",):
            return (500,)
        return (0, _Handle(0xF00))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shm, stream, kp, extra):
        import ctypes
        self.calls.append("launch")
        arr = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(arr[3]).value
        pb = ctypes.string_at(arr[1], size)
        p, v, n = struct.unpack_from("<QIi", pb)
        buf, o = self._find(p, 4 * n)
        buf[o:o + 4 * n] = struct.pack("<I", v) * n
        return (0,)


def _program(path, tamper=False, extra=None, incomplete=False, with_params=True, unsupported=False):
    s = Synth(path)
    s.call("cuInit", {"Flags": 0})
    s.call("cuDevicePrimaryCtxRetain", {"pctx": 0x111, "dev": 0})
    s.call("cuCtxSetCurrent", {"ctx": 0x111})
    s.call("cuModuleLoadData", {"module": 0x222, "image": 1}, x={"image": s.blob(b"IMG\0")})
    s.call("cuModuleGetFunction", {"hfunc": 0x333, "hmod": 0x222, "name": "fill"})
    s.call("cuModuleGetFunction", {"hfunc": 0x334, "hmod": 0x222, "name": "missing"}, r=500)
    s.fn(0x333, "fill", 0x222, [[0, 8], [8, 4], [12, 4]])
    A = 0x300000000000
    s.call("cuMemAlloc_v2", {"dptr": A, "bytesize": 64})
    s.call("cuMemAlloc_v2", {"dptr": A + 256, "bytesize": 64})
    s.call("cuDriverGetVersion", {"driverVersion": 13000})
    data = bytes(range(64))
    s.call("cuMemcpyHtoD_v2", {"dstDevice": A + 256, "srcHost": 5, "ByteCount": 64}, x={"srcHost": s.blob(data)})
    if unsupported:
        s.call("cuMipmappedArrayCreate", {"pHandle": 1})
    p = struct.pack("<QIi", A, 0xABCD0123, 16)
    if with_params:
        s.launch(0x333, p, block=16)
    else:
        s.call("cuLaunchKernel", {"f": 0x333, "gridDimX": 1, "gridDimY": 1, "gridDimZ": 1, "blockDimX": 1,
                                  "blockDimY": 1, "blockDimZ": 1, "sharedMemBytes": 0, "hStream": 0})
    if incomplete:
        s.call("cuCtxSynchronize", {}, r=None)
        s.close()
        return
    exp = struct.pack("<I", 0xABCD0123) * 16
    if tamper:
        exp = exp[:20] + b"\0" + exp[21:]
    s.call("cuMemcpyDtoH_v2", {"dstHost": 9, "srcDevice": A, "ByteCount": 64}, x={"dstHost": s.blob(exp)})
    s.call("cuMemcpyDtoH_v2", {"dstHost": 9, "srcDevice": A + 256, "ByteCount": 64}, x={"dstHost": s.blob(data)})
    s.call("cuMemFree_v2", {"dptr": A})
    s.call("cuMemFree_v2", {"dptr": A + 256})
    s.close()
    return A


def _run(path, drv=None, **kw):
    rp = Replayer(path, ReplayOptions(**kw), driver=drv or FakeCU())
    return rp.run(), rp


# ---------------------------------------------------------------------------- planning
def test_plan_spans_aligns_and_merges():
    spans = plan_spans([(0x1000_0000_0000, 100), (0x1000_0000_1000, 100), (0x1000_0040_0000, G),
                        (0x2000_0000_0000, 3 * G + 1)], G)
    assert spans == [(0x1000_0000_0000, G), (0x1000_0040_0000, G), (0x2000_0000_0000, 4 * G)]
    # adjacent granules merge into one span
    assert plan_spans([(0x1000_0000_0000, G), (0x1000_0000_0000 + G, 10)], G) == [(0x1000_0000_0000, 2 * G)]


class FakeOps:
    def __init__(self, occupied=()):
        self.occ = list(occupied)
        self.created, self.released, self.maps, self.unmaps = 0, 0, [], []
        self.next = 0x7000_0000_0000

    def reserve(self, size, addr, align=0):
        if any(a < addr + size and addr < a + n for a, n in self.occ):
            return 0x6000_0000_0000
        self.occ.append((addr, size))
        return addr

    def free_va(self, a, n):
        pass

    def create(self, n):
        self.created += 1
        return ("h", n)

    def map(self, a, n, h, off=0):
        self.maps.append((a, n))

    def set_access(self, a, n, flags=None):
        pass

    def unmap(self, a, n):
        self.unmaps.append((a, n))

    def release(self, h):
        self.released += 1

    def mem_alloc(self, n):
        self.next += 1 << 24
        return self.next

    def mem_free(self, p):
        pass


def test_small_allocations_share_a_granule_and_are_refcounted():
    ops = FakeOps()
    sp = AddressSpace(ops, G)
    base = 0x1000_0000_0000
    sp.plan([(base, 100), (base + 4096, 100), (base + G, 3 * G)])
    sp.reserve_all()
    assert sp.alloc(base, 100) == base
    assert sp.alloc(base + 4096, 100) == base + 4096
    assert ops.created == 1                        # one physical granule for both
    assert sp.alloc(base + G, 3 * G) == base + G
    assert ops.created == 2 and ops.maps[-1] == (base + G, 3 * G)
    sp.free(base)
    assert ops.unmaps == []                        # still referenced by the second allocation
    sp.free(base + 4096)
    assert ops.unmaps == [(base, G)] and ops.released == 1
    assert sp.placed == 3 and sp.fell_back == 0


def test_held_frees_keep_memory_mapped_until_released():
    ops = FakeOps()
    sp = AddressSpace(ops, G)
    base = 0x1000_0000_0000
    sp.plan([(base, 100)])
    sp.reserve_all()
    sp.alloc(base, 100)
    sp.hold_frees()
    sp.free(base)                                  # forgotten, but still mapped
    assert sp.find(base) is None and ops.unmaps == [] and sp.held_ranges() == [(base, 100)]
    assert sp.alloc(base, 100) == base and ops.created == 1     # the same granule again
    sp.free(base)
    assert sp.release_held() == 2 and ops.unmaps == [(base, G)] and sp.held is None
    sp.alloc(base, 100)
    sp.free(base)                                  # not holding: released at once
    assert len(ops.unmaps) == 2


def test_an_address_allocated_again_before_its_free_in_call_order_waits_for_that_free():
    """Two threads: an allocation entered (and so was numbered) before another thread's free
    returned the address it got.  The older allocation stays current until its free."""
    sp = AddressSpace(FakeOps(), G)
    p = 0x7f00_0000_0000
    sp.add_host(p, 4096, p, seq=1)                 # thread 1, placed at its recorded address
    sp.add_host(p, 4096, 0x5000_0000, seq=2)       # thread 2: entered first, got p after the free
    assert sp.find(p + 8).live_base == p           # thread 1 still uses its memory
    assert sp.free(p).seq == 1                     # thread 1's free
    assert sp.find(p + 8).live_base == 0x5000_0000
    assert sp.free(p).seq == 2 and sp.find(p) is None
    assert sp.free(p) is None
    # a module global looked up twice is one thing, not two waiting in line
    sp.add_global(p, 64, p, seq=3)
    sp.add_global(p, 64, p, seq=4)
    assert sp.free(p).seq == 4 and sp.find(p) is None


def test_program_mappings_are_tracked_through_partial_unmaps():
    sp = AddressSpace(FakeOps(), G)
    v = 0x7000_0000_0000
    sp.note_map(v, 4 * G)
    sp.note_map(v + 8 * G, G)
    assert sp.find_mapping(v + G + 5) == (v, 4 * G) and sp.find_mapping(v + 5 * G) is None
    sp.note_unmap(v + G, G)                        # a hole in the first mapping
    assert sorted(sp.mappings.items()) == [(v, G), (v + 2 * G, 2 * G), (v + 8 * G, G)]
    assert sp.find_mapping(v + G) is None and sp.find_mapping(v + 3 * G) == (v + 2 * G, 2 * G)
    sp.note_unmap(v, 16 * G)
    assert sp.mappings == {} and sp.find_mapping(v) is None


def test_fallback_when_reservation_misses_and_translation():
    base = 0x1000_0000_0000
    ops = FakeOps(occupied=[(base, G)])
    sp = AddressSpace(ops, G)
    sp.plan([(base + 0x100, 64), (base + 8 * G, 64)])
    sp.reserve_all()
    new = sp.alloc(base + 0x100, 64, seq=7)
    assert new != base + 0x100
    assert sp.alloc(base + 8 * G, 64) == base + 8 * G
    assert sp.fell_back == 1 and sp.placed == 1
    r = sp.relocations[0]
    assert r.seq == 7 and "did not honour" in r.reason
    assert sp.translate(base + 0x100 + 8) == new + 8
    assert sp.translate(base + 8 * G + 4) == base + 8 * G + 4
    # kernel parameters: only the moved pointer is rewritten
    params = struct.pack("<QQi4x", base + 0x108, base + 8 * G, 5)
    newp, ch = relocate_params(params, [[0, 8], [8, 8], [16, 4]], sp)
    assert ch == [(0, base + 0x108, new + 8)]
    assert struct.unpack_from("<Q", newp)[0] == new + 8
    # H2D payloads: stale addresses are found (and optionally rewritten)
    payload = struct.pack("<QQ", 12345, base + 0x100)
    same, found = scan_payload(payload, sp)
    assert same == payload and found == [(8, base + 0x100, new)]
    rew, _ = scan_payload(payload, sp, rewrite=True)
    assert struct.unpack("<QQ", rew)[1] == new


# ---------------------------------------------------------------------------- verification
def test_compare_exact_and_tolerance():
    e = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    assert compare(e, e, Tolerance()) is None
    g = struct.pack("<4f", 1.0, 2.0, 3.0001, 4.0)
    m = compare(e, g, Tolerance(), seq=5, call="cuMemcpyDtoH_v2")
    assert m is not None and m.offset in (8, 9, 10, 11) and m.seq == 5
    assert compare(e, g, Tolerance(rtol=1e-3, dtype="f32")) is None
    m = compare(e, g, Tolerance(rtol=1e-6, dtype="f32"))
    assert m.offset == 8 and m.dtype == "f32" and m.expected_val == 3.0 and abs(m.got_val - 3.0001) < 1e-6
    assert "byte offset 8" in m.describe()
    # exact compare with --dtype still shows values
    m = compare(e, g, Tolerance(dtype="f32"))
    assert m.offset == 8 and m.expected_val == 3.0
    # bf16 / f16
    b1 = struct.pack("<HH", 0x3F80, 0x4000)   # 1.0, 2.0
    b2 = struct.pack("<HH", 0x3F80, 0x4001)
    assert compare(b1, b2, Tolerance(rtol=1e-2, dtype="bf16")) is None
    assert compare(b1, b2, Tolerance(rtol=1e-5, dtype="bf16")).offset == 2
    h1, h2 = struct.pack("<2e", 1.0, 2.0), struct.pack("<2e", 1.0, 2.002)
    assert compare(h1, h2, Tolerance(atol=0.01, dtype="f16")) is None


def test_a_mismatch_like_float_rounding_says_so_and_how_to_accept_it():
    """Without --dtype, a divergence whose differing words read as float32 are within 1e-3 of the
    recorded values (an atomics reduction's order) gets a hint naming the tolerance that accepts
    it; other differences (integers, large changes) get none."""
    e = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    m = compare(e, struct.pack("<4f", 1.0, 2.0000002, 3.0, 4.0000005), Tolerance())
    assert "floating-point atomics" in m.hint and "--dtype f32 --rtol 1e-06" in m.hint
    assert m.hint in m.describe() and m.to_dict()["hint"] == m.hint
    assert compare(e, struct.pack("<4f", 1.0, 2.5, 3.0, 4.0), Tolerance()).hint == ""
    assert compare(struct.pack("<4i", 1, 2, 3, 4), struct.pack("<4i", 1, 2, 3, 5), Tolerance()).hint == ""
    assert compare(e, e[:12] + struct.pack("<f", float("nan")), Tolerance()).hint == ""
    assert compare(e, struct.pack("<4f", 1.0, 2.0000002, 3.0, 4.0), Tolerance(rtol=0, dtype="f32")).hint == ""
    assert "hint" not in compare(e, struct.pack("<4f", 9.0, 2.0, 3.0, 4.0), Tolerance()).to_dict()


# ---------------------------------------------------------------------------- engine with fake driver
def test_replay_verifies_and_places(tmp_path):
    p = tmp_path / "ok.cusnap"
    A = _program(p)
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    assert res.placed == 2 and res.fell_back == 0
    assert res.d2h_verified == 2 and res.d2h_bytes == 128 and res.launches == 1
    assert res.errors_recurred >= 1          # the recorded NOT_FOUND recurred
    assert res.skipped >= 1                  # cuDriverGetVersion query
    assert rp.ctx.cu.creates == 1                # both allocations share one granule
    assert not rp.ctx.space.allocs               # freed


def test_tampered_d2h_exits_1_naming_call_and_kernel(tmp_path):
    p = tmp_path / "bad.cusnap"
    _program(p, tamper=True)
    res, rp = _run(p)
    assert res.exit_code == 1
    m = res.mismatches[0]
    assert m["call"] == "cuMemcpyDtoH_v2" and m["offset"] == 20 and m["writer"][1] == "fill"
    assert "call #" in rp.ctx.mismatch_text[0] and "fill" in rp.ctx.mismatch_text[0]


def test_fallback_reported_and_params_relocated(tmp_path):
    p = tmp_path / "fb.cusnap"
    A = _program(p)
    drv = FakeCU(occupied=[(A, G)])
    res, rp = _run(p, drv)
    assert res.exit_code == 0, (res.errors, rp.ctx.mismatch_text)
    assert res.fell_back == 2 and res.placed == 0
    assert res.fallbacks[0]["rec_base"] == hex(A) and "did not honour" in res.fallbacks[0]["reason"]
    assert res.params_relocated == 1


def test_missing_params_and_unsupported_exit_2(tmp_path):
    p = tmp_path / "np.cusnap"
    _program(p, with_params=False)
    res, _ = _run(p)
    assert res.exit_code == 2 and "x.params missing" in res.errors[0] and "call #" in res.errors[0]
    p2 = tmp_path / "un.cusnap"
    _program(p2, unsupported=True)
    res, _ = _run(p2)
    assert res.exit_code == 2 and "cuMipmappedArrayCreate (1 call, first #" in res.errors[0] and "unsupported" in res.errors[0]
    assert res.d2h_verified == 0 and res.launches == 0     # refused before any driver work, all named at once
    res, _ = _run(p2, continue_on_error=True)
    assert res.exit_code == 2 and res.d2h_verified == 2   # surveyed past it


def test_continue_on_error_surveys_every_mismatch(tmp_path):
    p = tmp_path / "bad.cusnap"
    _program(p, tamper=True)
    res, _ = _run(p, continue_on_error=True)
    assert res.exit_code == 1 and res.d2h_verified == 2 and len(res.mismatches) == 1


def test_kernels_filter_skips_launch_but_not_state(tmp_path):
    p = tmp_path / "ok.cusnap"
    _program(p)
    res, rp = _run(p, kernels="^nomatch$", continue_on_error=True)
    assert res.exit_code == 2 and res.launches == 0 and res.placed == 0   # selects nothing: refused before work
    assert "no launch of the snapshot matches" in res.errors[0]
    res, rp = _run(p, calls="memcpy", continue_on_error=True)
    assert res.launches == 0 and res.filtered >= 1
    assert res.placed == 2            # allocations still ran
    # the kernel's output is not compared (its launch was left out); the other copy is
    assert res.exit_code == 0 and not res.mismatches and res.d2h_verified == 1 and res.d2h_left_out == 1
    res, _ = _run(p, calls="1-14")
    assert res.exit_code == 0


def test_incomplete_call_stops_and_says_so(tmp_path):
    p = tmp_path / "inc.cusnap"
    _program(p, incomplete=True)
    res, _ = _run(p)
    assert res.exit_code == 0 and res.stopped_at is not None
    assert any("never returned" in w for w in res.warnings)


def test_truncated_snapshot(tmp_path):
    p = tmp_path / "ok.cusnap"
    _program(p)
    data = p.read_bytes()
    t = tmp_path / "trunc.cusnap"
    t.write_bytes(data[: len(data) - 40])     # lose the trailer/index
    res, _ = _run(t)
    assert res.truncated
    assert any("truncated" in w for w in res.warnings)
    assert res.exit_code in (0, 1)


def test_missing_cuda_python_is_one_line_exit_2(tmp_path, monkeypatch):
    import sys
    p = tmp_path / "ok.cusnap"
    _program(p)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    res = Replayer(p, ReplayOptions()).run()
    assert res.exit_code == 2 and "cuda-python" in res.errors[0]


def test_dispatch_table():
    from cudasnap.replay import dispatch
    for n in ("cuMemAlloc_v2", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuMemcpyDtoHAsync_v2",
              "cuStreamBeginCapture_v2", "cuMemsetD2D8_v2", "cuModuleLoadData", "cuDeviceGetAttribute"):
        assert n in dispatch.REPLAY_HANDLED, n
    assert dispatch.is_query("cuPointerGetAttributes") and not dispatch.is_query("cuMemAlloc_v2")
    assert dispatch.lookup("cuMemcpyHtoDAsync_v2_ptsz").family == "memory"


def test_archcheck():
    from cudasnap.replay.archcheck import analyze, runnable
    ptx = b".version 8.0\n.target sm_80\n"
    assert analyze(ptx) == (set(), {80})
    assert runnable(ptx, (9, 0)) is None
    assert "no SASS" in runnable(ptx, (7, 5))
    elf = bytearray(64)
    elf[:4] = b"\x7fELF"
    elf[4] = 2
    struct.pack_into("<I", elf, 48, 90)
    assert analyze(bytes(elf)) == ({90}, set())
    assert runnable(bytes(elf), (9, 0)) is None and runnable(bytes(elf), (8, 0))
