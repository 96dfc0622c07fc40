"""cudasnap.formats: the .cusnap snapshot container (see SCHEMA.md).

The neutral core of cudasnap: imports no other cudasnap part but the API description's loader
(vocab.py: what kind of call a record is). console.py holds the version and the console every
layer uses.
"""
from .container import CHUNK_SIZE, FORMAT_VERSION, MAX_FRAME, SCHEMA_VERSION, SnapshotError
from .reader import SnapshotReader
from .recover import repair
from .writer import BlobStream, SnapshotWriter
from .callset import parse_callset
from .cuerrors import CURESULT_NAMES, cu_result_name

__all__ = [
    "SnapshotWriter", "SnapshotReader", "SnapshotError", "BlobStream", "repair",
    "FORMAT_VERSION", "SCHEMA_VERSION", "CHUNK_SIZE", "MAX_FRAME",
    "parse_callset", "CURESULT_NAMES", "cu_result_name",
]
