"""Time every kernel of a Python program natively with CUPTI activity records (cupti-python):

    python cupti_native.py OUT.json script.py [args...]

OUT.json: {"kernels": {name: [duration_us, ...]}, "count": n}.  Names are CUPTI's (the same
source as `cudasnap replay --profile timeline` rows' cupti_name)."""
import atexit
import json
import runpy
import sys

from cupti import cupti

out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
kernels = {}


def _req():
    return 8 << 20, 0


def _done(acts):
    for a in acts:
        if a.kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL):
            kernels.setdefault(str(a.name), []).append((int(a.end) - int(a.start)) / 1e3)


cupti.activity_register_callbacks(_req, _done)
cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)


@atexit.register
def _write():
    try:
        cupti.activity_flush_all(1)
    except Exception:
        pass
    with open(out, "w") as f:
        json.dump({"kernels": kernels, "count": sum(len(v) for v in kernels.values())}, f)


sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
