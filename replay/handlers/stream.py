"""Streams and events."""
from __future__ import annotations

from . import handles


@handles("cuStreamSetAttribute", "cuStreamCopyAttributes")
def stream_attr(ctx, rec):
    pass  # scheduling hints (access policy windows, priorities): no effect on results


