"""`replay --wrap 'TOOL ARGS'` and `--preload TOOL.so` on the CUDA test double: the replay runs
under a fake tool (a script that records its argv and environment, then runs the rest) with the
same options, the exit status passes through, a missing tool or library is one line and exit 2,
and a preloaded library (built with gcc) lands in the replay process only."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from synth import write_double_program
from cudasnap.wrap import WrapError, command, strip_args, tool_options

FAKE_TOOL = f"""#!{sys.executable}
# A stand-in for compute-sanitizer/ncu/nsys: records argv and environment, then runs the target
# (the first argument that is an executable file) with what follows it.
import json, os, subprocess, sys
args = sys.argv[1:]
i = next(i for i, a in enumerate(args) if os.path.isfile(a) and os.access(a, os.X_OK))
with open(os.environ["FAKE_TOOL_LOG"], "a") as f:
    f.write(json.dumps({{"name": os.path.basename(sys.argv[0]), "own": args[:i], "target": args[i:],
                        "env": dict(os.environ), "pid": os.getpid()}}) + "\\n")
env = dict(os.environ)
if env.get("FAKE_TOOL_PRELOAD"):                 # tools inject themselves into their target so
    env["LD_PRELOAD"] = env["FAKE_TOOL_PRELOAD"]
if env.get("FAKE_TOOL_EXIT"):                    # as compute-sanitizer --error-exitcode does
    subprocess.run(args[i:], env=env)
    sys.exit(int(env["FAKE_TOOL_EXIT"]))
os.execve(args[i], args[i:], env)
"""

PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* Logs, when loaded, its tag, the process id and the command line (NULs as spaces). */
__attribute__((constructor)) static void loaded(void) {
    const char *log = getenv("PRELOAD_LOG");
    if (!log) return;
    char cmd[4096] = {0};
    FILE *c = fopen("/proc/self/cmdline", "rb");
    size_t n = c ? fread(cmd, 1, sizeof cmd - 1, c) : 0;
    if (c) fclose(c);
    for (size_t i = 0; i < n; i++) if (!cmd[i]) cmd[i] = ' ';
    FILE *f = fopen(log, "a");
    if (f) { fprintf(f, "%s %d %s\n", TAG, (int)getpid(), cmd); fclose(f); }
}
"""


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrap")
    bindir = d / "bin"
    bindir.mkdir()
    tool = bindir / "fake-tool"
    tool.write_text(FAKE_TOOL)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    for alias in ("compute-sanitizer", "ncu", "nsys"):
        (bindir / alias).symlink_to(tool)
    src = d / "preload.c"
    src.write_text(PRELOAD_C)
    libs = {}
    for tag in ("mine", "tools"):
        libs[tag] = d / f"lib{tag}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f'-DTAG="{tag}"', "-o", str(libs[tag]), str(src)],
                       check=True, capture_output=True)
    good, bad = d / "good.cusnap", d / "bad.cusnap"
    write_double_program(good)
    write_double_program(bad, tamper=True)
    return {"dir": d, "bin": bindir, "tool": tool, "libs": libs, "good": good, "bad": bad}


def _run(double, kit, tmp_path, *args, env=None, timeout=120):
    e = dict(double["env"])
    e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    e["PATH"] = f"{kit['bin']}{os.pathsep}{e.get('PATH', os.defpath)}"
    e["FAKE_TOOL_LOG"] = str(tmp_path / "tool.log")
    e["PRELOAD_LOG"] = str(tmp_path / "preload.log")
    e["PYTHONPATH"] = str(tmp_path / "marker") + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    cp = subprocess.run([sys.executable, "-m", "cudasnap", "replay", *map(str, args)], env=e, capture_output=True,
                        text=True, timeout=timeout)
    log = tmp_path / "tool.log"
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    pl = tmp_path / "preload.log"
    loads = [x.split(" ", 2) for x in pl.read_text().splitlines()] if pl.exists() else []
    return cp, calls, loads


def test_wrapped_replay_keeps_its_options_and_environment(double, kit, tmp_path):
    out = tmp_path / "prof.json"
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap=fake-tool --tool memcheck --log 'a b'",
                        "--profile", "timeline", "-k", "regex:add_one|chase", "--out", out, "--json")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert len(calls) == 1
    c = calls[0]
    assert c["own"] == ["--tool", "memcheck", "--log", "a b"]
    assert c["target"] == [sys.executable, "-m", "cudasnap", "replay", str(kit["good"]), "--profile", "timeline",
                           "-k", "regex:add_one|chase", "--out", str(out), "--json"]
    # the environment reaches the tool and the replay unchanged
    assert c["env"]["PYTHONPATH"].startswith(str(tmp_path / "marker"))
    assert c["env"]["LD_LIBRARY_PATH"] == double["env"]["LD_LIBRARY_PATH"]
    assert "LD_PRELOAD" not in c["env"]
    # the replay ran with those options: the JSON result on stdout, the profile of the two kernels
    res = json.loads(cp.stdout)
    assert res["exit_code"] == 0
    prof = json.loads(out.read_text())
    assert sorted(k["name"] for k in prof["kernels"]) == ["add_one", "chase"]
    assert cp.stderr.startswith("cudasnap: replay under: ") and "fake-tool --tool memcheck" in cp.stderr


def test_exit_status_passes_through(double, kit, tmp_path):
    cp, calls, _ = _run(double, kit, tmp_path, kit["bad"], "--wrap", "fake-tool", "-q")
    assert cp.returncode == 1 and len(calls) == 1, cp.stdout + cp.stderr       # the replay's mismatch
    assert "replay under" not in cp.stderr                                      # -q: the problem only
    assert "bytes differ" in cp.stderr, cp.stderr
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap", "fake-tool", "-q", env={"FAKE_TOOL_EXIT": "7"})
    assert cp.returncode == 7, cp.stdout + cp.stderr                           # the tool's own status
    # a replay that cannot start says so through the tool, with its exit 2
    cp, _calls, _ = _run(double, kit, tmp_path, tmp_path / "none.cusnap", "--wrap", "fake-tool")
    assert cp.returncode == 2 and "none.cusnap" in cp.stderr


@pytest.mark.parametrize("wrap,msg", [("no-such-tool-4711 --x", "--wrap: no-such-tool-4711: not found on PATH"),
                                      ("./not-here/tool", "--wrap: ./not-here/tool: not an executable file"),
                                      ("", "--wrap is empty"),
                                      ("fake-tool 'unclosed", "No closing quotation")])
def test_a_wrapper_that_cannot_run_is_one_line(double, kit, tmp_path, wrap, msg):
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap", wrap)
    assert cp.returncode == 2 and cp.stdout == "" and not calls, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cudasnap: error: ") and msg in err[0], err


def test_preload_reaches_the_replay_process_only(double, kit, tmp_path):
    mine, tools = kit["libs"]["mine"], kit["libs"]["tools"]
    # alone: the replay process loads it
    cp, calls, loads = _run(double, kit, tmp_path, kit["good"], "--preload", mine, "-q")
    assert cp.returncode == 0 and not calls, cp.stdout + cp.stderr
    assert [ld[0] for ld in loads] == ["mine"] and "-m cudasnap replay" in loads[0][2]
    assert "--preload" not in loads[0][2]
    (tmp_path / "preload.log").unlink()
    # under a tool that injects a library of its own into what it runs: the tool's process does
    # not get ours, the replay process gets both
    cp, calls, loads = _run(double, kit, tmp_path, kit["good"], "--wrap", "fake-tool --x", "--preload", mine, "-q",
                            env={"FAKE_TOOL_PRELOAD": str(tools)})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "LD_PRELOAD" not in calls[0]["env"]
    ours = [ld for ld in loads if ld[0] == "mine"]
    assert len(ours) == 1 and "-m cudasnap replay" in ours[0][2], loads
    assert any(ld[0] == "tools" and "-m cudasnap replay" in ld[2] for ld in loads), loads
    assert len({ld[1] for ld in loads}) == 1          # sh execs the replay: one process, never the tool's
    t = calls[0]["target"]
    assert calls[0]["own"] == ["--x"] and os.path.basename(t[0]) == "sh" and t[1] == "-c" and t[3] == str(mine)
    assert t[4:] == [sys.executable, "-m", "cudasnap", "replay", str(kit["good"]), "-q"]


@pytest.mark.parametrize("make,msg", [(lambda d: d / "missing.so", "no such file"),
                                      (lambda d: d / "text.so", "not a shared library")])
def test_a_preload_that_cannot_load_is_one_line(double, kit, tmp_path, make, msg):
    (tmp_path / "text.so").write_text("not ELF\n")
    cp, calls, loads = _run(double, kit, tmp_path, kit["good"], "--preload", make(tmp_path))
    assert cp.returncode == 2 and not calls and not loads, cp.stdout + cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and err[0].startswith("cudasnap: error: --preload "), err


def test_known_tools_get_what_the_replay_asks(double, kit, tmp_path):
    """compute-sanitizer exits non-zero on the errors it reports; with --profiler-range workload
    ncu and nsys start collecting at the replay's cuProfilerStart, which comes right before the
    replayed work."""
    plog = tmp_path / "profiler.log"
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap", "compute-sanitizer --tool memcheck", "-q")
    assert cp.returncode == 0 and calls[-1]["own"] == ["--tool", "memcheck", "--error-exitcode", "1"]
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap", "ncu --section SpeedOfLight", "-q",
                        "--profiler-range", "workload", env={"CUDA_DOUBLE_PROFILER_LOG": str(plog)})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert calls[-1]["own"] == ["--section", "SpeedOfLight", "--profile-from-start", "off"]
    assert calls[-1]["target"][-2:] == ["--profiler-range", "workload"]
    starts = [ln for ln in plog.read_text().splitlines() if ln.startswith("cuProfilerStart")]
    assert starts == ["cuProfilerStart 0"], plog.read_text()                  # before any replayed work
    cp, calls, _ = _run(double, kit, tmp_path, kit["good"], "--wrap", "nsys profile -o rep", "-q",
                        "--profiler-range=workload")
    assert cp.returncode == 0 and calls[-1]["own"] == ["profile", "-o", "rep", "--capture-range=cudaProfilerApi"]


def test_tool_options_are_added_only_when_missing():
    assert tool_options(["compute-sanitizer", "--error-exitcode=3"], False) == []
    assert tool_options(["/opt/cuda/bin/compute-sanitizer"], False) == ["--error-exitcode", "1"]
    assert tool_options(["ncu", "--profile-from-start", "on"], True) == []
    assert tool_options(["ncu"], False) == []
    assert tool_options(["nsys", "profile", "-c", "cudaProfilerApi"], True) == []
    assert tool_options(["nsys", "launch"], True) == []
    assert tool_options(["valgrind"], True) == []


def test_strip_args_removes_only_wrap_and_preload():
    takes = {"--wrap": True, "--preload": True, "-k": True, "--kernel-name": True, "-c": True, "-q": False,
             "--json": False, "--kernels": True}
    assert strip_args(["s.cusnap", "--wrap", "t --x", "--json"], takes) == ["s.cusnap", "--json"]
    assert strip_args(["--wrap=t", "s", "--preload=/x.so", "-q"], takes) == ["s", "-q"]
    # an option's value is never taken for --wrap, and clustered short options keep their value
    assert strip_args(["s", "--kernels", "--wrap", "-qc", "5", "-qk", "--preload"], takes) == \
        ["s", "--kernels", "--wrap", "-qc", "5", "-qk", "--preload"]
    assert strip_args(["s", "-c5", "--", "--wrap"], takes) == ["s", "-c5", "--", "--wrap"]


def test_command_is_built_without_running(tmp_path):
    with pytest.raises(WrapError, match="not found on PATH"):
        command(["s"], {}, "nope-4711", None, False, env={"PATH": str(tmp_path)})
    argv, env = command(["s", "-q"], {"-q": False}, None, None, False, env={"PATH": os.defpath, "LD_PRELOAD": "x.so"})
    assert argv == [sys.executable, "-m", "cudasnap", "replay", "s", "-q"] and env["LD_PRELOAD"] == "x.so"
