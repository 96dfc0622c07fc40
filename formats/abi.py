"""ABI names of driver entry points. The one place that strips ABI suffixes: the recorded
name is the ABI symbol (cuMemcpyHtoD_v2, cuLaunchKernel_ptsz, cuMemcpy_ptds), the base is the
name cuda.h documents. shim/api_description.json carries the same base per ABI name (a test
checks they agree); this rule also covers names the description does not know."""
from __future__ import annotations

import re
from functools import lru_cache

_SUFFIX = re.compile(r"(_v\d+)?(_pt(sz|ds))?(_v\d+)?$")


@lru_cache(maxsize=4096)
def base_name(f: str) -> str:
    """cuMemcpyHtoD_v2 -> cuMemcpyHtoD, cuLaunchKernel_ptsz -> cuLaunchKernel."""
    return _SUFFIX.sub("", f)


_PER_THREAD = re.compile(r"_pt(sz|ds)$")


def strip_per_thread(f: str) -> str:
    """cuStreamSynchronize_ptsz -> cuStreamSynchronize (versions kept: cuMemcpyHtoD_v2)."""
    return _PER_THREAD.sub("", f)


def per_thread(f: str) -> bool:
    """The per-thread default stream variant (_ptsz / _ptds): stream 0 means the thread's stream."""
    return "_ptsz" in f or "_ptds" in f
