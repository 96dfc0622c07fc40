"""Runtime access to the CUDA Driver API description (shim/api_description.json).

    from cudasnap.shim.description import load
    d = load()
    d.by_name("cuMemAlloc_v2")["params"][0]["kind"]      # 'out'
    d.resolve("cuMemAlloc", 3020, 0)                        # 'cuMemAlloc_v2'
    d.result_name(0)                                        # 'CUDA_SUCCESS'

Standard library only; no cuda.h, no GPU.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

_JSON_NAME = "api_description.json"
CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2

_lock = threading.Lock()
_cached: Optional["Description"] = None


class Description:
    """The parsed description with lookup helpers. Treat the dicts as read-only."""

    def __init__(self, doc: Dict[str, Any]):
        self.doc = doc
        self.schema: int = doc["schema"]
        self.source: str = doc.get("source", "")
        self.cuda_version: int = doc.get("cuda_version", 0)
        self.digest: str = doc["digest"]
        self.types: Dict[str, Any] = doc["types"]
        self.functions: List[Dict[str, Any]] = doc["functions"]
        self.versions: Dict[str, Any] = doc["versions"]
        self._by_name = {f["name"]: f for f in self.functions}
        results = self.types.get("CUresult", {}).get("values", {})
        self._result_names: Dict[int, str] = {}
        for n, v in sorted(results.items(), key=lambda kv: kv[0]):
            self._result_names.setdefault(v, n)
        # ABI symbol -> base, for symbols the version table knows
        self._base_of: Dict[str, str] = {f["name"]: f["base"] for f in self.functions}

    # ---- lookups
    def by_name(self, abi_name: str) -> Optional[Dict[str, Any]]:
        return self._by_name.get(abi_name)

    def by_id(self, i: int) -> Dict[str, Any]:
        return self.functions[i]

    def __contains__(self, abi_name: str) -> bool:
        return abi_name in self._by_name

    def __len__(self) -> int:
        return len(self.functions)

    def type(self, name: str) -> Optional[Dict[str, Any]]:
        return self.types.get(name)

    def result_name(self, code: int) -> str:
        """CUresult code -> enumerator name ('CUDA_ERROR_<code>' if unknown)."""
        return self._result_names.get(int(code), f"CUDA_ERROR_{int(code)}")

    def base_of(self, abi_name: str) -> Optional[str]:
        return self._base_of.get(abi_name)

    # ---- cuGetProcAddress emulation
    def resolve(self, base: str, cuda_version: int, flags: int = 0) -> Optional[str]:
        """ABI symbol cuGetProcAddress(base, cuda_version, flags) would return.

        flags & 2 (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) prefers the _ptds/_ptsz
        variant. Otherwise the highest ABI version <= cuda_version; if cuda_version is lower
        than every version, the lowest. None for unknown names.
        """
        v = self.versions.get(base)
        if v is None:
            if base in self._by_name:  # already an ABI name
                return base
            return None
        if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM:
            per = v.get("per_thread")
            if per:
                return _pick(per, cuda_version)
            for key in ("ptds", "ptsz"):
                if v.get(key):
                    return v[key]
        return _pick(v["abi"], cuda_version)


def _pick(pairs, cuda_version: int) -> str:
    best = None
    for ver, sym in pairs:  # sorted ascending by version
        if ver <= cuda_version:
            best = sym
    return best if best is not None else pairs[0][1]


def _read_text() -> str:
    try:
        from importlib import resources

        return resources.files("cudasnap.shim").joinpath(_JSON_NAME).read_text(encoding="utf-8")
    except Exception:
        return (Path(__file__).resolve().parent / _JSON_NAME).read_text(encoding="utf-8")


def load() -> Description:
    """The packaged description, parsed once per process."""
    global _cached
    if _cached is None:
        with _lock:
            if _cached is None:
                _cached = Description(json.loads(_read_text()))
    return _cached


def load_path(path) -> Description:
    """A description from an explicit file (tests, tools); not cached."""
    return Description(json.loads(Path(path).read_text(encoding="utf-8")))
