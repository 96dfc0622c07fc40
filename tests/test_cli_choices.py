"""Choices and ranges are declared to typer: --help lists them and the parser enforces the same."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from cudasnap.cli import app


def _help(cmd: str) -> str:
    res = CliRunner().invoke(app, [cmd, "--help"])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())          # help wraps; compare words


@pytest.mark.parametrize("cmd, shown", [
    ("capture", ["--placement region|off", "--drain lazy|eager", "1<=x<=22", "1<=x<=65536", "0<=x<=32",
                 "0<=x<=16", "-f, --force-overwrite", "%p", "%h", "%q{VAR}"]),
    ("replay", ["--dtype [CALL=|KERNEL=]TYPE", "--profile timeline|isolated|graph", "x>=1", "x>=0"]),
    ("dump", ["--format text|jsonl"]),
    ("extract", ["--memory reachable|all", "--ranges exact|segment"]),
    ("api", ["--status replay|record|refused"]),
    ("stats", ["--format text|csv|json", "--report api|kernels|memory", "FILE.sqlite|DIR/"]),
])
def test_help_lists_choices_and_ranges(cmd, shown):
    h = _help(cmd)
    for s in shown:
        assert s in h, (cmd, s)


def test_level_help_and_check_agree():
    h = _help("capture")
    m = re.search(r"--level N .*?\[default: 3; (\d+)<=x<=(\d+)\]", h)
    assert m and (m.group(1), m.group(2)) == ("1", "22"), h
    assert "1 fastest .. 22" in h


@pytest.mark.parametrize("args", [
    ["capture", "--level", "23", "--", "true"],
    ["capture", "--level", "0", "--", "true"],
    ["capture", "--placement", "nowhere", "--", "true"],
    ["capture", "--drain", "sometimes", "--", "true"],
    ["capture", "--segments", "17", "--", "true"],
    ["capture", "--copy-threads", "33", "--", "true"],
    ["capture", "--ring-mb", "0", "--", "true"],
    ["replay", "x.cusnap", "--profile", "everything"],
    ["replay", "x.cusnap", "--repeat", "0"],
    ["replay", "x.cusnap", "--rtol", "-1", "--dtype", "f32"],
    ["dump", "x.cusnap", "--format", "xml"],
    ["extract", "x.cusnap", "-o", "y.cusnap", "--ranges", "tight"],
    ["extract", "x.cusnap", "-o", "y.cusnap", "--memory", "some"],
    ["api", "--status", "maybe"],
    ["stats", "x.cusnap", "--format", "xml"],
    ["stats", "x.cusnap", "--report", "gpu"],
])
def test_out_of_range_and_unknown_choices_are_refused(args, tmp_path):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    opt = next(a for a in args if a.startswith("--"))
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cudasnap: error: Invalid value for '{opt}'"), res.output


@pytest.mark.parametrize("args, says", [
    (["info", "x.cusnap", "--extra"], "No such option: --extra ({prog} info -h lists them)"),
    (["nosuchcmd"], "No such command 'nosuchcmd'. ({prog} -h lists them)"),
    (["campaign", "nosuch"], "No such command 'nosuch'. ({prog} campaign -h lists them)"),
])
def test_usage_errors_are_one_line(args, says):
    """The program (not click's usage block): an unknown option or command, one line."""
    import subprocess
    import sys
    cp = subprocess.run([sys.executable, "-m", "cudasnap", *args], capture_output=True, text=True, timeout=60)
    want = "cudasnap: error: " + says.format(prog="python -m cudasnap")
    assert cp.returncode == 2 and cp.stderr.strip().splitlines() == [want], cp.stderr


def test_a_tolerance_and_exact_together_are_refused(tmp_path):
    """--exact and a tolerance contradict each other: one line, exit 2, from the CLI and the API
    alike (a tolerance alone is fine: element types come from the kernels' PTX)."""
    snap = tmp_path / "x.cusnap"
    snap.write_bytes(b"x")
    res = CliRunner().invoke(app, ["replay", str(snap), "--rtol", "1e-5", "--exact"])
    assert res.exit_code == 2 and "--exact asks for bit-exact" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    from cudasnap.replay import replay
    r = replay(snap, tolerance="ulp:x")
    assert r.exit_code == 2 and "--tolerance 'ulp:x': expected" in r.message, r.message


def test_choices_reach_the_commands(double, capture, tmp_path):
    cp, snap = capture(double["progs"]["direct"], "1")
    assert cp.returncode == 0, cp.stderr
    res = CliRunner().invoke(app, ["dump", str(snap), "--format", "jsonl", "--calls", "launches"])
    assert res.exit_code == 0 and res.output.lstrip().startswith("{")
    res = CliRunner().invoke(app, ["api", "--status", "refused", "--json"])
    assert res.exit_code == 0


def test_an_unforeseen_error_is_one_line_naming_where_and_debug_shows_the_traceback():
    """An exception no command expected is a defect or input no check foresaw: one line with its
    type, message and place in cudasnap, exit 2; CUDASNAP_DEBUG=1 gives the traceback."""
    import os
    import subprocess
    import sys
    prog = ("import cudasnap.cli as c\n"
            "def boom(*a, **k):\n"
            "    {}['k']\n"
            "c.app = boom\n"
            "c.main()\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDASNAP_DEBUG"}
    cp = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=60)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    (line,) = cp.stderr.strip().splitlines()
    assert line.startswith("cudasnap: error: internal error (KeyError: 'k'") and "CUDASNAP_DEBUG=1" in line, line
    cp = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                        env=dict(env, CUDASNAP_DEBUG="1"), timeout=60)
    assert cp.returncode == 1 and "Traceback" in cp.stderr and "KeyError" in cp.stderr
