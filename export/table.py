"""The translation table: which Emitter method (export/emit.py and its parts) translates the
calls of each API, by base name and ABI name, from the overrides table (shim/overlay.py
OVERRIDES, "export", read through the description). A call with no entry here is translated by
its class when it has one: a plain execute call (class plain_args: values and handles) through
the description (Emitter.e_generic); pure queries and host-only calls are left out; anything
else stops the export with its name."""
from __future__ import annotations

from typing import Dict

from cudasnap.formats.vocab import overridden

# base or ABI name -> emitter method name ("e_none": left out, saying so)
TABLE: Dict[str, str] = {}
for _name, _base, _o in overridden():
    if _o.get("export"):
        TABLE[_name] = _o["export"]
        TABLE.setdefault(_base, _o["export"])
