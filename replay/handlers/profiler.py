"""Profiler control: cuProfilerStart/Stop are called on replay (a profiler that collects only
between them sees the range the program asked for), unless --profiler-range workload puts the
range around the replayed workload instead (Replayer.profiler_control); cuProfilerInitialize
(deprecated) is a counted no-op. None has an effect on results."""
from __future__ import annotations


def profiler_control(ctx, rec):
    ctx.profiler_control(rec)
