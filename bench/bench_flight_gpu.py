"""Flight-recorder overhead on a PyTorch training loop (bench/demo_window_gpu.sh runs it).

  python3 bench/bench_flight_gpu.py loop SECONDS [WIDTH]    # the loop: prints STEP_MS p50 and STEPS
  python3 bench/bench_flight_gpu.py compare SECONDS PERIOD  # native vs --flight-recorder=PERIOD, alternated

The loop trains an MLP (AdamW, bf16 autocast) for SECONDS with steps of roughly 5-50 ms on an
H100 (WIDTH 4096: about 10 ms), each step inside an NVTX range "step", and prints the median
step time after a warm-up. `compare` runs native and captured loops twice each, alternating
(the host's own noise is large: medians of pairs), and prints the ratio and the checkpoint
pauses the capture summary reports."""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def loop(seconds: float, width: int) -> None:
    import torch

    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(1024, width, device="cuda"), torch.randn(1024, width, device="cuda")
    times, t_end, step = [], time.monotonic() + seconds, 0
    while time.monotonic() < t_end or step < 20:
        t0 = time.perf_counter()
        torch.cuda.nvtx.range_push("step")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        lv = loss.item()                 # one D2H per step, as training loops log
        torch.cuda.nvtx.range_pop()
        times.append((time.perf_counter() - t0) * 1e3)
        step += 1
    steady = times[10:]
    print(f"STEP_MS p50 {statistics.median(steady):.3f}")
    print(f"STEP_MS mean {statistics.mean(steady):.3f} max {max(steady):.3f}")   # checkpoint pauses included
    print(f"STEPS {step} last loss {lv:.4f}")


def _run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(r"STEP_MS p50 ([\d.]+)", p.stdout)
    mm = re.search(r"STEP_MS mean ([\d.]+)", p.stdout)
    if p.returncode != 0 or not m or not mm:
        sys.exit(f"FAIL  {' '.join(cmd[:6])}...: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return float(m.group(1)), float(mm.group(1)), p.stderr


def compare(seconds: float, period: float) -> None:
    me = [sys.executable, os.path.abspath(__file__), "loop", str(seconds)]
    d = tempfile.mkdtemp(prefix="flight-bench-")
    native, flight, nmean, fmean, pauses = [], [], [], [], []
    for i in range(2):
        ms, mean, _e = _run(me)
        native.append(ms)
        nmean.append(mean)
        ms, mean, err = _run([sys.executable, "-m", "cudasnap", "capture", "-o", f"{d}/loop{i}.cusnap",
                              f"--flight-recorder={period}", "--", *me])
        flight.append(ms)
        fmean.append(mean)
        m = re.search(r"checkpoint pauses p50 ([\d.]+) ms, max ([\d.]+) ms", err)
        if m:
            pauses.append((float(m.group(1)), float(m.group(2))))
        for line in err.splitlines():
            if re.search(r"checkpoint \d+: state|dropped|missing", line):
                print("   ", line.split(": ", 1)[-1])
        ok = "no trigger, nothing written" in err and not os.listdir(d)
        print(f"{'PASS' if ok else 'FAIL'}  flight recorder, clean exit: nothing written ({err.strip().splitlines()[0] if err.strip() else 'no summary'})")
    ratio = statistics.median(f / n for f, n in zip(flight, native))
    mratio = statistics.median(f / n for f, n in zip(fmean, nmean))
    print(f"flight recorder overhead: step p50 native {statistics.median(native):.3f} ms, "
          f"captured {statistics.median(flight):.3f} ms, ratio {ratio:.3f}x; step mean (checkpoint pauses "
          f"included) native {statistics.median(nmean):.3f} ms, captured {statistics.median(fmean):.3f} ms, "
          f"ratio {mratio:.3f}x (checkpoint every {period:g} s)")
    if pauses:
        p50, pmax = statistics.median(p for p, _ in pauses), max(m for _, m in pauses)
        print(f"checkpoint pauses: p50 {p50:.1f} ms, max {pmax:.1f} ms")
        print(f"{'PASS' if pmax < 1000 else 'FAIL'}  checkpoint pauses under a second (max {pmax:.1f} ms)")
    print(f"{'PASS' if ratio <= 1.03 else 'FAIL'}  flight recorder steady-state overhead <= 1.03x ({ratio:.3f}x)")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "loop":
        loop(float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4096)
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        compare(float(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit(__doc__)
