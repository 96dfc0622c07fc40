"""The replay's exceptions: a leaf module every part of replay/ may import."""
from __future__ import annotations

from cudasnap.formats import cu_result_name


class ReplayError(Exception):
    """Replay cannot proceed past this call (exit code 2)."""

    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


class DriverCallError(Exception):
    """A driver call made outside any record (Replayer.raw, DriverOps) failed."""

    def __init__(self, name: str, code: int):
        super().__init__(f"{name} returned {cu_result_name(code)}")
        self.name, self.code = name, code
