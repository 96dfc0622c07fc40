"""Profiler control (cuProfilerInitialize/Start/Stop): no effect on results; counted no-ops."""
from __future__ import annotations

from . import handles


@handles("cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop")
def profiler_noop(rp, rec):
    pass
