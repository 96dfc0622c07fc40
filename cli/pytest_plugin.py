"""pytest plugin (entry point `pytest11: cudasnap`): snapshots as tests.

    pytest app.cusnap                      # replay it on GPU 0 and verify every D2H result
    pytest snapshots/ --cudasnap-device 1 --cudasnap-dtype f32 --cudasnap-rtol 1e-5

Each `*.cusnap` file becomes one test item, `PATH::replay`, marked `gpu`: it runs
`cudasnap replay PATH` in a child process (a GPU fault in one snapshot cannot leave a broken
context behind for the next) and passes when the replay verifies (exit 0); the replay's
report is the failure text. An item is skipped where cuda-bindings is not installed.

Which files are collected: a `.cusnap` named on the command line, or lying under a directory
named on the command line. Directories pytest walks on its own (testpaths, the rootdir when no
path is given) yield no snapshot items unless `--cudasnap` is given (or `cudasnap = true` in
the ini file), so a project's own test run is not changed by snapshots kept in its tree.
`-p no:cudasnap` turns the plugin off.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

SUFFIX = ".cusnap"
DTYPES = ("f32", "f16", "bf16", "f64")


def pytest_addoption(parser) -> None:
    g = parser.getgroup("cudasnap", "cudasnap snapshot replay")
    g.addoption("--cudasnap", action="store_true", default=None,
                help="Collect every *.cusnap found, also under paths not named on the command line.")
    g.addoption("--cudasnap-device", type=int, default=0, metavar="N", help="GPU ordinal to replay on (default 0).")
    g.addoption("--cudasnap-rtol", type=float, default=0.0, metavar="F",
                help="Relative tolerance of D2H verification (with --cudasnap-dtype).")
    g.addoption("--cudasnap-atol", type=float, default=0.0, metavar="F",
                help="Absolute tolerance of D2H verification (with --cudasnap-dtype).")
    g.addoption("--cudasnap-dtype", choices=DTYPES, default=None,
                help="Element type the tolerances apply to: " + ", ".join(DTYPES) + ".")
    g.addoption("--cudasnap-tolerance", default=None, metavar="TOL",
                help="As replay's --tolerance: exact, torch, rtol=R,atol=A or ulp:N (default: replay's by target).")
    g.addoption("--cudasnap-timeout", type=float, default=None, metavar="SECONDS",
                help="Seconds one replay may take before its test fails.")
    parser.addini("cudasnap", type="bool", default=False,
                  help="Collect every *.cusnap found, as --cudasnap does.")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a real NVIDIA GPU")


def _named(config) -> List[Path]:
    """The paths named on the command line (not testpaths, not the implicit rootdir)."""
    src = getattr(config, "args_source", None)
    if src is not None and src != pytest.Config.ArgsSource.ARGS:
        return []
    out = []
    for a in config.args:
        p = Path(str(a).split("::", 1)[0])
        out.append((p if p.is_absolute() else Path(config.invocation_params.dir) / p).resolve())
    return out


def _wanted(config, path: Path) -> bool:
    if config.getoption("cudasnap") or config.getini("cudasnap"):
        return True
    path = path.resolve()
    return any(path == n or n in path.parents for n in _named(config))


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == SUFFIX and _wanted(parent.config, file_path):
        from cudasnap.formats.group import is_manifest
        if is_manifest(file_path):          # a job's manifest (`cudasnap replay` replays it), not a snapshot
            return None
        return SnapshotFile.from_parent(parent, path=file_path)
    return None


class SnapshotFile(pytest.File):
    def collect(self):
        item = SnapshotItem.from_parent(self, name="replay")
        item.add_marker(pytest.mark.gpu)
        yield item


class ReplayFailed(Exception):
    pass


class SnapshotItem(pytest.Item):
    def runtest(self) -> None:
        try:
            import cuda.bindings.driver  # noqa: F401
        except ImportError:
            pytest.skip("cuda-bindings is not installed (pip install 'cudasnap[gpu]')")
        from cudasnap.replay.invocation import command, document
        opt = self.config.getoption
        fields = {"device": opt("cudasnap_device"), "quiet": False}
        if opt("cudasnap_dtype"):
            fields.update(dtype=opt("cudasnap_dtype"), rtol=opt("cudasnap_rtol"), atol=opt("cudasnap_atol"))
        if opt("cudasnap_tolerance"):
            fields["tolerance"] = opt("cudasnap_tolerance")
        # the replay as a typed document (replay/invocation.py)
        cmd = command(sys.executable, dict(document(str(self.path), fields), json=True))
        timeout = opt("cudasnap_timeout")
        try:
            # a process of its own: a fault's sticky error or a hang fails this item, not the session's others
            cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ReplayFailed(f"replay took longer than {timeout} s (--cudasnap-timeout)")
        self.user_properties.append(("cudasnap_exit", cp.returncode))
        if cp.returncode != 0:
            raise ReplayFailed(_report(cp))

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ReplayFailed):
            return f"cudasnap replay {self.path}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"cudasnap replay {self.path.name}"


def _report(cp: subprocess.CompletedProcess) -> str:
    what = {1: "verification mismatch", 2: "replay could not proceed"}.get(cp.returncode, f"exit {cp.returncode}")
    lines = [what]
    try:
        res = json.loads(cp.stdout)
    except ValueError:
        res = None
    if isinstance(res, dict):
        if res.get("message"):
            lines.append(str(res["message"]))
        lines += [f"  error: {e}" for e in (res.get("errors") or [])[:10]]
        lines += [f"  {m}" for m in (res.get("mismatch_text") or [])[:20]]
    elif cp.stdout.strip():
        lines.append(cp.stdout.strip()[-4000:])
    if cp.stderr.strip():
        lines.append(cp.stderr.strip()[-4000:])
    return os.linesep.join(lines)
