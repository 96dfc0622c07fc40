"""cudasnap: CUDA snapshot-and-replay.

This package is the folder cli/: the command line (cli.py and the *_cmd.py modules, typer)
and the Python entry points. The parts, each its own subpackage, lowest first (each imports
only those below it; tests/test_structure.py checks):
  cudasnap.formats   the .cusnap container, schema, blob store, recovery, record vocabulary, console
  cudasnap.shim      the API description (cuda.h + overlay) and the preloaded interception library
  cudasnap.capture   `cudasnap capture`: runs a program under the shim, records snapshots
  cudasnap.replay    `cudasnap replay`: re-executes a snapshot through cuda-python, profiles, simulates
  cudasnap.compare   `cudasnap compare`: A/B statistics of two profiles and their reports
  cudasnap.export    `cudasnap export` / `extract`: a snapshot as a standalone program, one launch alone
  cudasnap.campaign  `cudasnap campaign` and `bisect`: replays across environments and GPUs on Ray
  cudasnap.advise    `cudasnap advise`: what-if replays and hints from a profile

From Python (every name is imported on first use: `import cudasnap` loads nothing else and
needs no cuda-python):

    import cudasnap
    res = cudasnap.capture.run(["./app"], out="app.cusnap")     # CaptureResult
    with cudasnap.SnapshotReader(res.snapshot) as r: ...
    result = cudasnap.replay.replay("app.cusnap", device=0)     # ReplayResult (needs a GPU)

`cudasnap.replay` is the replay package; its function `replay` replays (the package cannot be
called itself); `cudasnap.capture.run` and `cudasnap.replay.replay` mirror the two commands.
"""

__all__ = ["SnapshotReader", "SnapshotWriter", "SnapshotError", "CaptureResult", "ReplayOptions", "ReplayResult",
           "capture", "formats", "replay", "__version__"]

_SUBPACKAGES = ("capture", "formats", "replay", "shim")
_NAMES = {"SnapshotReader": "cudasnap.formats", "SnapshotWriter": "cudasnap.formats",
          "SnapshotError": "cudasnap.formats", "CaptureResult": "cudasnap.capture",
          "ReplayOptions": "cudasnap.replay", "ReplayResult": "cudasnap.replay"}


def __getattr__(name: str):
    import importlib

    if name == "__version__":           # one definition, below every layer
        return importlib.import_module("cudasnap.formats.console").__version__
    if name in _SUBPACKAGES:
        return importlib.import_module(f"cudasnap.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'cudasnap' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
