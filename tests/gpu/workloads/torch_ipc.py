"""Two processes sharing CUDA tensors through torch.multiprocessing (legacy CUDA IPC memory
and event handles): the parent sends a tensor, the child adds to it in place and sends back a
new tensor, the parent reads both. Prints one checksum line per process step."""
import torch
import torch.multiprocessing as mp


def child(q_in, q_out, done):
    x = q_in.get()                        # opened through cudaIpcOpenMemHandle
    x.add_(1.0)
    y = (x * 2.0).contiguous()
    torch.cuda.synchronize()
    print(f"CHILD {float(x.sum()):.1f}", flush=True)
    q_out.put(y)
    done.wait()                           # y's memory lives until the parent has read it


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q_in, q_out, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=child, args=(q_in, q_out, done))
    p.start()
    torch.manual_seed(0)
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32) / 1024
    q_in.put(x)
    y = q_out.get()
    print(f"PARENT {float(x.sum()):.1f} {float(y.sum()):.1f}", flush=True)
    del y
    done.set()
    p.join()
    raise SystemExit(p.exitcode)
