"""Profiling workload (PyTorch): the bf16 GPT of prof_gpt_train.py with AdamW capturable=True,
so that its eager loop and a CUDA graph of its step run the same kernels.

    python prof_gpt_graph.py eager [STEPS]           the eager loop (what a test captures)
    python prof_gpt_graph.py native OUT.json [STEPS [PAD_MB]]
                                    eager steps and replays of one captured graph of the step,
                                    alternating, timed by CUPTI; PAD_MB: MiB allocated before the
                                    model, which moves every tensor (bench/RESULTS.md)

OUT.json: {"eager": {name: [us, ...]}, "graph": {name: [us, ...]}, "graph_records": n}; names are
CUPTI's.  Graph-mode replay of the eager loop's snapshot is right when it agrees with "graph"."""
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prof_gpt_train import make_step as make_train_step  # noqa: E402


def make_step():
    return make_train_step(capturable=True)


def capture(step):
    """A CUDA graph of one step (warmed up on a side stream first, as torch.cuda.graph asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    return g


def eager(steps: int) -> None:
    step = make_step()
    for i in range(steps):
        loss = step()
        torch.cuda.synchronize()
        if i % 20 == 19 or i == steps - 1:
            print(f"step {i + 1} loss {loss.item():.4f}")


def native(steps: int, pad_mb: int = 0) -> dict:
    """CUPTI kernel durations of `steps` eager steps and `steps` graph replays, in alternating
    halves (after 5 untimed runs each), in one process."""
    from cupti import cupti
    pad = torch.empty(pad_mb << 20, dtype=torch.uint8, device="cuda") if pad_mb else None   # held to the end
    step = make_step()
    g = capture(step)
    phase = {"name": None}
    durs = {"eager": defaultdict(list), "graph": defaultdict(list)}
    in_graph = [0]

    def done(acts):
        for a in acts:
            if a.kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL) and phase["name"]:
                durs[phase["name"]][str(a.name)].append((int(a.end) - int(a.start)) / 1e3)
                in_graph[0] += int(getattr(a, "graph_id", 0) or 0) != 0
    cupti.activity_register_callbacks(lambda: (8 << 20, 0), done)
    cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
    for name, run in (("eager", step), ("graph", g.replay)) * 2:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        phase["name"] = name
        for _ in range(steps // 2):
            run()
            torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        phase["name"] = None
    cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
    return {"eager": durs["eager"], "graph": durs["graph"], "graph_records": in_graph[0],
            "device": torch.cuda.get_device_name(), "pad_mib": pad.numel() >> 20 if pad is not None else 0}


if __name__ == "__main__":
    if sys.argv[1:2] == ["native"]:
        out = native(int(sys.argv[3]) if len(sys.argv) > 3 else 60, int(sys.argv[4]) if len(sys.argv) > 4 else 0)
        Path(sys.argv[2]).write_text(json.dumps(out))
    else:
        eager(int(sys.argv[2]) if len(sys.argv) > 2 else 60)
