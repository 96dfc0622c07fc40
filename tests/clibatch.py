"""Many cudasnap commands for one interpreter start, for tests that run dozens of short commands
only to see how each ends (exit status, what it printed, no traceback, no hang).

Each command still runs in a process of its own: a child forked from one Python that imported
the command line once, with stdin at /dev/null, its own stdout and stderr, and an alarm as its
time bound. The child runs what `python -m cudasnap` runs (cudasnap.entry.main), then the exit
handlers, as the interpreter's exit would. The start-up a `python -m cudasnap` pays per command
(interpreter, imports: most of a short command's time) is paid once per batch.

    ends = run(cmds, env, tmp_dir, timeout=90)     # [Ended(returncode, stdout, stderr, timed_out)]
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Sequence


class Ended(NamedTuple):
    returncode: int      # the exit status; -N: ended by signal N
    stdout: str
    stderr: str
    timed_out: bool      # ended by the alarm: past the time bound


_BATCH = r"""
import atexit, json, os, signal, sys, traceback
import cudasnap.cli, cudasnap.entry          # once, before the forks
req = json.loads(sys.stdin.read())
ends = []
for i, args in enumerate(req["cmds"]):
    base = os.path.join(req["dir"], f"cmd{i}")
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.alarm(req["timeout"])
        fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
        for n, ext in ((1, "out"), (2, "err")):
            fd = os.open(f"{base}.{ext}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.dup2(fd, n); os.close(fd)
        sys.argv = ["cudasnap", *args]
        try:
            cudasnap.entry.main()
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:                            # as the interpreter does with sys.exit("text")
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()            # as the interpreter does with an uncaught exception
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            traceback.print_exc()
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass
        os._exit(code & 0xFF)
    _, status = os.waitpid(pid, 0)
    ends.append(os.waitstatus_to_exitcode(status))
print(json.dumps(ends))
"""


def run(cmds: Sequence[Sequence[str]], env: dict, work: Path, timeout: int = 90) -> List[Ended]:
    """Runs each command (cudasnap's arguments) in turn; their outputs are kept under work."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    req = {"cmds": [[str(a) for a in c] for c in cmds], "dir": str(work), "timeout": int(timeout)}
    cp = subprocess.run([sys.executable, "-c", _BATCH], input=json.dumps(req), env=env, capture_output=True,
                        text=True, timeout=timeout * len(cmds) + 60)
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = []
    for i, code in enumerate(json.loads(cp.stdout.splitlines()[-1])):
        text = [(work / f"cmd{i}.{ext}").read_text(errors="replace") for ext in ("out", "err")]
        out.append(Ended(code, text[0], text[1], code == -signal.SIGALRM))
    return out
