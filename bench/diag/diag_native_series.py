"""Native run-to-run series of prof_torch's HBM-bound tanh (32M floats), timed by CUPTI through
torch.profiler: is the two-level spread seen in isolated replay a property of the GPU?

  python bench/diag/diag_native_series.py [N] [PADS] [--json OUT]

"synced": each run alone (L2 scrubbed by a read-only reduction, synchronize, tanh,
synchronize), as isolated replay runs them; "queued": N tanh launches back to back.
PADS (default "0"): comma list; with p > 0 each tanh is followed by p tiny launches (does the
two-level pattern follow the count of launches between runs?).  --json OUT: every series, and
the (max - min) / median of each consecutive 10 runs of the synced series (what isolated
replay's 10 repeats of one launch see; tests/gpu/test_gpu_profile.py holds isolated mode to it)."""
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

argv = sys.argv[1:]
json_out = None
if "--json" in argv:
    i = argv.index("--json")
    json_out = argv[i + 1]
    del argv[i:i + 2]
n = int(argv[0]) if argv else 40
pads = [int(p) for p in (argv[1] if len(argv) > 1 else "0").split(",")]
out = {"device": torch.cuda.get_device_name(), "series": {}}
x = torch.randn(32 << 20, device="cuda")
y = torch.empty_like(x)
scrub = torch.zeros(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4 + 1, device="cuda")


def series(prof):
    t = [e.time_range.elapsed_us() for e in prof.events()
         if e.device_type == torch.autograd.DeviceType.CUDA and "tanh" in e.name]
    return t[3:]            # first runs warm up


tiny = torch.zeros(1, device="cuda")
for mode, pad in [(m, p) for p in pads for m in ("synced", "queued")]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n + 3):
            if mode == "synced":
                scrub.sum()
                torch.cuda.synchronize()
            torch.tanh(x, out=y)
            for _ in range(pad):
                tiny.add_(1)
            if mode == "synced":
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    t = series(prof)
    med = statistics.median(t)
    print(f"native {mode} pad {pad}: median {med:.2f} us, max-min {(max(t) - min(t)) / med * 100:.2f}%, "
          f"noise {statistics.pstdev(t) / statistics.fmean(t) * 100:.2f}%")
    print("   " + " ".join(f"{v:.1f}" for v in t))
    out["series"][f"{mode} pad {pad}"] = t
    if mode == "synced" and pad == 0:
        tens = [t[i:i + 10] for i in range(0, len(t) - 9, 10)]
        out["synced_10run_spread_pct"] = [(max(c) - min(c)) / statistics.median(c) * 100 for c in tens]
if json_out:
    with open(json_out, "w") as f:
        json.dump(out, f)
