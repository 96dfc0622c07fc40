"""The calls that load code or look a kernel up (classes loads_code, names_function,
refers_code): what the preflight, the numerics' PTX types and --replace read of a snapshot. A
replay's index holds them apart (IndexedReader.code_calls: nothing decoded); any other reader
gives every call record, which the callers filter by class as before. A leaf module: the
handlers that ask import nothing of the index."""
from __future__ import annotations

from typing import Any, Dict, Iterable


def code_calls(reader) -> Iterable[Dict[str, Any]]:
    held = getattr(reader, "code_calls", None)
    got = held() if held is not None else None
    return got if got is not None else reader.records(("c",))
