"""The simulator's replay process: runs in a directory holding the model's config files, with
the simulator's libcudart first on LD_LIBRARY_PATH. The simulator prints its log on file
descriptor 1, so that goes to a file; the replay's own report goes to the original stdout."""
from __future__ import annotations

import json
import os
import sys
import time


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    sys.stdout.flush()
    from cudasnap.formats.console import pipe_safe_text, write_failure
    # a reader gone (| head) must not turn the verdict into an error; a full disk is told to the parent
    report = pipe_safe_text(os.dup(1), report_as=1)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.close(log)
    sys.stdout = sys.stderr           # stray prints of this process stay off the simulator's log

    from cudasnap.replay import ReplayOptions
    from cudasnap.replay.invocation import ReplayRequest, run_request
    from .driver import SimDriver
    from .progress import Progress

    prog = Progress(job["total"], job["mode"], enabled=not job["quiet"] and job["progress"] is not False,
                    force=bool(job["progress"]))
    drv = SimDriver(job["adapter"], job["dir"], job["ptx"], job["modules"],
                    {k: [tuple(x) for x in v] for k, v in job["layouts"].items()}, job["replace"],
                    job["device_name"], tuple(job["cc"]), on_launch=prog.step, exact=job["exact"],
                    images=job.get("images"), max_ctas=job.get("max_ctas"), globals_=job.get("globals"),
                    sample_verdict=bool(job.get("sample_verdict")), whole=job.get("whole"), on_note=prog.note)
    opts = ReplayOptions(**job["options"])
    t0 = time.perf_counter()
    code = 2
    try:
        code = run_request(ReplayRequest(job["snapshot"], opts, json=job["json"], out=report, driver=drv))
    except Exception as e:          # exit 1 would claim a mismatch: anything unforeseen cannot proceed
        sys.stderr.write(f"cudasnap: error: the simulated replay failed: {type(e).__name__}: {e}\n")
        code = 2
    finally:
        prog.close()
        report.flush()
        with open(job["result"], "w") as f:
            json.dump({"launches": drv.launches, "unsupported": drv.unsupported, "sampled": drv.sampled, "whole_runs": drv.whole_runs,
                       "wall_s": time.perf_counter() - t0, "report_failed": write_failure(1)}, f)
    return code


if __name__ == "__main__":
    try:
        code = main(sys.argv[1])
    except Exception as e:
        sys.stderr.write(f"cudasnap: error: the simulated replay could not start: {type(e).__name__}: {e}\n")
        code = 2
    sys.stderr.flush()
    os._exit(code)        # the simulator's threads and exit handlers have nothing left to do
