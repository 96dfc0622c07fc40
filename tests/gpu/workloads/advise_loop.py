"""Launch-bound PyTorch loop for `cudasnap advise` (tests/gpu/test_gpu_advise.py): each step is
a chain of small elementwise ops on a 4096-element tensor (microsecond kernels, launch-bound).

    python advise_loop.py eager STEPS           the eager loop (what the test captures)
    python advise_loop.py native OUT.json STEPS eager steps and replays of one CUDA graph of
                                                the step, alternating halves; per-step wall times
OUT.json: {"eager_step_us": [...], "graph_step_us": [...], "device": name}."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prof_gpt_graph import capture as graph_of  # noqa: E402  (a CUDA graph of one step, warmed up)

OPS = 40


def make_step():
    x = torch.ones(4096, device="cuda")

    def step():
        y = x
        for _ in range(OPS // 2):
            y = y * 1.0001 + 0.0001
        x.copy_(y)
    return step


def timed(run, steps):
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "eager":
        step = make_step()
        for _ in range(int(sys.argv[2])):
            step()
            torch.cuda.synchronize()
        print("done")
    else:
        steps = int(sys.argv[3])
        step = make_step()
        g = graph_of(step)
        res = {"eager_step_us": [], "graph_step_us": [], "device": torch.cuda.get_device_name()}
        for name, run in (("eager", step), ("graph", g.replay)) * 2:
            timed(run, 5)
            res[f"{name}_step_us"] += timed(run, steps // 2)
        res["eager_median_us"] = statistics.median(res["eager_step_us"])
        res["graph_median_us"] = statistics.median(res["graph_step_us"])
        with open(sys.argv[2], "w") as f:
            json.dump(res, f)
