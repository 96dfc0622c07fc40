"""pin.py CPUS COMMAND...: run COMMAND on the given CPUs ("1,2" or "3-15"); used by the benchmarks
to keep the measured program and the recorder on separate cores."""
import os
import sys


def cpus(spec: str) -> set:
    out = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out & os.sched_getaffinity(0) or os.sched_getaffinity(0)


os.sched_setaffinity(0, cpus(sys.argv[1]))
os.execvp(sys.argv[2], sys.argv[2:])
