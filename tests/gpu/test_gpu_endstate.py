"""GPU suite, window end state: the replay-side hash is capture's (hash_kernel.cu on the GPU
equals replay/endstate.py's host sum), and a PyTorch window without a device-to-host copy
replays with its end state verified on the GPU."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu


class _Driver:
    """The few calls endstate._Hasher makes, through cuda-bindings."""

    def __init__(self):
        from cuda.bindings import driver as cu
        self.cu = cu
        self.raw("cuInit", 0)
        dev = self.raw("cuDeviceGet", 0)
        self.ctx = self.raw("cuDevicePrimaryCtxRetain", dev)
        self.raw("cuCtxSetCurrent", self.ctx)

    def raw(self, name, *args):
        res = getattr(self.cu, name)(*args)
        assert int(res[0]) == 0, (name, res[0])
        return res[1] if len(res) == 2 else tuple(res[1:])


def test_hash_kernel_equals_the_host_sum():
    import ctypes
    from cudasnap.replay import endstate as E
    import types
    d = _Driver()
    h = E._Hasher(types.SimpleNamespace(ctx=d))      # the hasher reaches the driver through rp.ctx.raw
    assert h.where == "GPU"
    for size in (16, 4096 + 48, (9 << 20) + 160, 3 * (4 << 20)):
        data = os.urandom(size)
        ptr = int(d.raw("cuMemAlloc", size))
        try:
            d.raw("cuMemcpyHtoD", ptr, data, size)
            got = h.hashes(ptr, size & ~15)
            assert got == E.host_hashes(data[: size & ~15]), size
            assert len(got) == (size + E.CHUNK - 1) // E.CHUNK
            buf = ctypes.create_string_buffer(size)
            d.raw("cuMemcpyDtoH", ctypes.addressof(buf), ptr, size)
            assert buf.raw == data
        finally:
            d.raw("cuMemFree", ptr)
    h.close()


LOOP = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    w = torch.randn(512, 512, device="cuda")
    x = torch.randn(64, 512, device="cuda")
    for step in range(30):
        x = torch.relu(x @ w) * 0.05 + x
    print("SUM", float(x.sum().item()))
""")


def test_torch_window_without_d2h_verifies_its_end_state(tmp_path):
    pytest.importorskip("torch")
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP)
    out = tmp_path / "w.cusnap"
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "capture", "-o", str(out), "--window", "launches:20-40",
                         "--", sys.executable, str(prog)], capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    w1 = tmp_path / "w.w1.cusnap"
    assert w1.exists(), cp.stderr[-3000:]
    rp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", str(w1)], capture_output=True, text=True,
                        timeout=600)
    print(rp.stdout[-3000:])
    assert rp.returncode == 0, rp.stdout[-3000:] + rp.stderr[-3000:]
    assert "0 D2H result(s) verified" in rp.stdout
    m = re.search(r"end state: (\d+) allocation\(s\), ([\d.]+) MiB verified \(hashed on the GPU\)", rp.stdout)
    assert m and int(m.group(1)) >= 1 and float(m.group(2)) > 0, rp.stdout[-3000:]
