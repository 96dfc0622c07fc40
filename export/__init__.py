"""cudasnap.export: take a snapshot elsewhere.

- export_snapshot(snapshot, outdir, calls=None): a standalone C program (one .c file, a
  Makefile, data files) that replays the snapshot through the plain Driver API and verifies it.
- extract(snapshot, out, ...): a small self-contained snapshot of selected launches.
"""
from .emit import ExportError, ExportResult, export_snapshot

__all__ = ["export_snapshot", "ExportError", "ExportResult"]
