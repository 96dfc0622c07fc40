"""A small bf16 GPT trained with AdamW (about 250 launches a step), one step per
torch.cuda.synchronize(), timed in-process: the training-loop row of bench/bench_replay_gpu.py.

    python gpt_step.py eager [STEPS]   the eager loop (captured and replayed by the bench)
    python gpt_step.py graph [STEPS]   the same step captured once as a CUDA graph and replayed
                                       (the GPU-bound time; AdamW capturable=True there)
Prints `step_ms <median of steps 10..STEPS>` and `STEPS <n>`; the eager loop's per-step
synchronize is a cuCtxSynchronize, the step boundary replay times (result's sync_mono); two
synchronizations in a row, with no launch or memory call between them, open the loop."""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu" / "workloads"))
from prof_gpt_train import make_step as make_eager_step  # noqa: E402  (the GPU suite's profiling model)

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
if mode == "graph":                 # AdamW capturable=True: prof_gpt_graph's step and its capture
    from prof_gpt_graph import capture, make_step  # noqa: E402
    run = capture(make_step()).replay
else:
    run = make_eager_step()
torch.cuda.synchronize()
torch.cuda.synchronize()        # two in a row: marks the loop's start in the snapshot
times = []
for i in range(steps):
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(f"step_ms {statistics.median(times[10:] or times) * 1e3:.4f}")
print(f"STEPS {steps}")
