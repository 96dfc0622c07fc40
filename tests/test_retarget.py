"""Re-targeting: module images' architectures (cubin e_flags, fatbin entries, PTX), the replay
preflight that refuses a module with no code for the GPU before anything runs, and
`replay --jit ptx` loading the PTX a fatbin carries (zstd- or LZ4-compressed)."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
import zstandard

from snapedit import rewrite
from cudasnap.replay.retarget import analyze, launches_from_device, lz4_block, ptx_of, verdict

DOUBLE_PTX = b"CUDADOUBLE\n.version 9.0\n.target sm_80\nkernel add_one\nkernel fill\n"


def cubin(sm: int, abi: int = 8) -> bytes:
    h = bytearray(64)
    h[:4] = b"\x7fELF"
    h[4], h[5], h[6], h[7], h[8] = 2, 1, 1, 0x33, abi
    struct.pack_into("<I", h, 48, (sm << 8) if abi >= 8 else sm)
    return bytes(h) + b"\0" * 64


def lz4_literals(data: bytes) -> bytes:
    """An LZ4 block of literals only (what the decoder must pass through)."""
    n = len(data)
    out = bytearray([min(n, 15) << 4])
    if n >= 15:
        rest = n - 15
        while rest >= 255:
            out.append(255)
            rest -= 255
        out.append(rest)
    return bytes(out) + data


def fatbin(entries) -> bytes:
    """entries: (kind 1 PTX | 2 ELF, arch, payload, compression '' | 'zstd' | 'lz4')."""
    body = b""
    for kind, arch, data, comp in entries:
        raw = len(data)
        if comp == "zstd":
            data, flags = zstandard.ZstdCompressor().compress(data), 0x8011
        elif comp == "lz4":
            data, flags = lz4_literals(data), 0x2011
        else:
            flags = 0x11
        stored = data + b"\0" * (-len(data) % 8)
        hdr = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(stored), len(data) if comp else 0, 0, 0, 9, arch,
                          0, 0, flags, 0, raw if comp else 0)
        body += hdr + stored
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_image_analysis_and_verdicts():
    assert analyze(cubin(90)).sass == [90] and analyze(cubin(80)).format == "cubin"
    assert analyze(cubin(75, abi=7)).sass == [75]
    fb = fatbin([(2, 80, cubin(80), ""), (1, 80, b".version 8.0\n.target sm_80\n", "zstd")])
    info = analyze(fb)
    assert (info.format, info.sass, info.ptx) == ("fatbin", [80], [80])
    assert verdict(info, (9, 0))[0] == "jit" and verdict(info, (8, 6))[0] == "sass"
    assert verdict(analyze(fatbin([(2, 80, cubin(80), "")])), (9, 0))[0] == "none"
    assert verdict(analyze(fatbin([(2, 90, cubin(90), "")])), (9, 0))[0] == "sass"
    assert verdict(analyze(fatbin([(1, 100, b".version 9.0\n", "")])), (9, 0))[0] == "none"   # PTX above the GPU
    two = fatbin([(2, 70, cubin(70), "")]) + fatbin([(2, 90, cubin(90), "")])                # concatenated containers
    assert analyze(two).sass == [70, 90]
    assert analyze(b".version 8.5\n.target sm_52\n.address_size 64\n").ptx == [52]
    assert analyze(b"CUDADOUBLE\nkernel add_one\n").format == "unknown"


@pytest.mark.parametrize("comp", ["", "zstd", "lz4"])
def test_ptx_is_extracted_whatever_the_compression(comp):
    text = b".version 9.0\n.target sm_90\n" + b"// padding line\n" * 40
    fb = fatbin([(2, 90, cubin(90), ""), (1, 80, b".version 8.0\n.target sm_80\n", comp), (1, 90, text, comp)])
    arch, ptx = ptx_of(fb, (9, 0))
    assert arch == 90 and ptx == text + b"\0"
    assert ptx_of(fb, (8, 6))[0] == 80            # the highest the GPU can JIT
    assert ptx_of(fatbin([(2, 90, cubin(90), "")])) is None


def test_lz4_back_references():
    data = b"abc" * 7
    block = bytes([0x3E]) + b"abc" + b"\x03\x00"    # 3 literals, then an 18-byte match 3 back
    assert lz4_block(block, len(data)) == data
    with pytest.raises(ValueError):
        lz4_block(bytes([0x10]) + b"a" + b"\x09\x00", 10)   # reaches before the start


def _cli(double, *args):
    return subprocess.run([sys.executable, "-m", "cudasnap", *args], env=double["env"], capture_output=True,
                          text=True, timeout=120)


def _with_image(src, dst, image: bytes):
    """The snapshot with every module image replaced."""
    rewrite(src, dst, payload=lambda key, data: image if key == "image" else data)


def test_preflight_refuses_a_module_without_code_for_the_gpu(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    sm80 = tmp_path / "sm80.cusnap"
    _with_image(snap, sm80, fatbin([(2, 80, cubin(80), "")]))
    rp = _cli(double, "replay", str(sm80))
    assert rp.returncode == 2, rp.stdout + rp.stderr
    assert "preflight: 1 module image(s)" in rp.stdout and "neither SASS for sm_90 nor PTX" in rp.stdout
    assert "no code for sm_90" in rp.stderr and "add_one" in rp.stderr and "nothing was replayed" in rp.stderr
    assert "cudasnap replay:" not in rp.stdout
    info = _cli(double, "info", str(sm80))
    assert "Modules" in info.stdout and "sm_80" in info.stdout
    js = json.loads(_cli(double, "info", str(sm80), "--json").stdout)
    img = js["module_images"][0]
    assert (img["format"], img["sass"], img["ptx"], img["launched"]) == ("fatbin", ["sm_80"], [], ["add_one"])


def test_profiled_replays_and_the_api_get_the_same_preflight(double, capture, tmp_path):
    """Every entry point runs the architecture check before the GPU does anything: a profile
    (the campaign's cells take this path too), and replay() of the Python API."""
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    sm80 = tmp_path / "sm80.cusnap"
    _with_image(snap, sm80, fatbin([(2, 80, cubin(80), "")]))
    for mode in ("timeline", "isolated"):
        out = tmp_path / f"{mode}.json"
        rp = _cli(double, "replay", str(sm80), "--profile", mode, "--out", str(out))
        assert rp.returncode == 2, rp.stdout + rp.stderr
        assert "preflight: 1 module image(s)" in rp.stdout and "neither SASS for sm_90 nor PTX" in rp.stdout
        assert "no code for sm_90" in rp.stderr and "nothing was replayed" in rp.stderr
        assert not out.exists()
    code = ("import json, sys\nfrom cudasnap.replay import replay\nr = replay(sys.argv[1])\n"
            "print(json.dumps([r.exit_code, r.errors, r.calls]))")
    api = subprocess.run([sys.executable, "-c", code, str(sm80)], env=double["env"], capture_output=True, text=True,
                         timeout=120)
    rc, errors, calls = json.loads(api.stdout)
    assert rc == 2 and calls == 0 and "no code for sm_90" in errors[0], api.stdout + api.stderr


@pytest.mark.parametrize("comp", ["zstd", "lz4"])
def test_jit_ptx_loads_the_recorded_ptx(comp, double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"])
    assert cp.returncode == 0
    both = tmp_path / "both.cusnap"
    _with_image(snap, both, fatbin([(2, 80, cubin(80), ""), (1, 80, DOUBLE_PTX, comp)]))
    rp = _cli(double, "replay", str(both), "--jit", "ptx")
    assert rp.returncode == 0, rp.stdout + rp.stderr
    assert "--jit ptx: loaded from its PTX" in rp.stdout
    assert "loaded from compute_80 PTX" in rp.stdout and "load with JIT took" in rp.stdout
    plain = _cli(double, "replay", str(both))          # the preflight says JIT; the double itself cannot load fatbins
    assert "PTX only (compute_80): JIT-compiled for sm_90" in plain.stdout
    sass_only = tmp_path / "sass.cusnap"
    _with_image(snap, sass_only, fatbin([(2, 90, cubin(90), "")]))
    rp = _cli(double, "replay", str(sass_only), "--jit", "ptx")
    assert rp.returncode == 2 and "has no PTX to JIT" in rp.stderr


def test_launch_override_reruns_with_other_sizes_and_verifies(double, capture):
    cp, snap = capture(double["progs"]["direct"])          # add_one over 1024 floats, 4 blocks of 256
    assert cp.returncode == 0
    same = _cli(double, "replay", str(snap), "--launch-override", "grid=8,1,1,block=128,1,1")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "10 launch(es) of 1 kernel(s) replayed with grid 8x1x1, block 128x1x1" in same.stdout
    short = _cli(double, "replay", str(snap), "--launch-override", "grid=1,block=32,kernel=add_")
    assert short.returncode == 1 and "DIFFERENT:" in short.stdout      # fewer threads than elements: it shows
    big = _cli(double, "replay", str(snap), "--launch-override", "block=4096")
    assert "left as recorded (block of 4096 threads, the kernel allows 1024)" in big.stdout
    # nothing ran at the size asked: exit 2, not a verified 0
    assert big.returncode == 2 and "--launch-override changed no launch (add_one: block of 4096 threads" in big.stdout
    none = _cli(double, "replay", str(snap), "--launch-override", "block=64,kernel=^nosuch$")
    assert none.returncode == 2 and "changed no launch (no launch of a kernel matching '^nosuch$')" in none.stdout
    bad = _cli(double, "replay", str(snap), "--launch-override", "grid=x")
    assert bad.returncode == 2 and "grid takes integers" in bad.stderr
    # a profile replays with the override too (it used to be left out there, silently)
    prof = _cli(double, "replay", str(snap), "--profile", "isolated", "--repeat", "2", "--warmup", "0",
                "--launch-override", "grid=1,block=32,kernel=add_")
    assert prof.returncode == 1 and "DIFFERENT:" in prof.stdout, prof.stdout + prof.stderr
    prof = _cli(double, "replay", str(snap), "--profile", "timeline", "--launch-override", "grid=x")
    assert prof.returncode == 2 and "grid takes integers" in prof.stderr, prof.stderr


@pytest.mark.parametrize("comp", ["", "zstd", "lz4"])
def test_code_that_launches_kernels_from_the_device_is_recognised(comp):
    """Graph mode names a module whose SASS links the device runtime's cudaLaunchDevice (dynamic
    parallelism) when its graph faults: found whatever the entry's compression."""
    cdp = cubin(90) + b"\0__cudaCDP2LaunchDeviceV2\0__cudaCDP2GetParameterBufferV2\0"     # as CUDA 13 links it
    assert launches_from_device(fatbin([(2, 90, cdp, comp)]))
    assert launches_from_device(cdp) and launches_from_device(cubin(90) + b"\0cudaLaunchDeviceV2\0")
    assert not launches_from_device(fatbin([(2, 90, cubin(90) + b"\0cudaCGGetIntrinsicHandle\0", comp)]))
    # PTX naming the function is not code that launches
    assert not launches_from_device(fatbin([(1, 90, b".version 8.0\n.target sm_90\ncudaLaunchDeviceV2", comp)]))
