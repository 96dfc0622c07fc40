"""The index's record summary (formats/summary.py, SCHEMA.md `summary`): info uses it without
decoding records, gives the same answer as a scan, and falls back to a scan when the index is
absent (crash), cut off or written without it; a malformed one is a one-line error that
`cudasnap repair` clears."""
from __future__ import annotations

import json
import os
import sys

from cudasnap.formats import SnapshotReader
from cudasnap.formats.container import (
    FRAME_SIZE, KIND_INDEX, TRAILER, TRAILER_MAGIC, TRAILER_SIZE, encode_payload, new_packer, pack_frame_header, xxh64,
)
from cudasnap.formats.summary import check_map
from cudasnap.inspect_cmds import summarize

sys.path.insert(0, os.path.dirname(__file__))
from test_inspect import _stderr, app, make_session, runner  # noqa: E402


def _info(path):
    res = runner.invoke(app, ["info", str(path), "--json"])
    return res, (json.loads(res.stdout) if res.exit_code == 0 else None)


def _same(a, b, ignore=("file", "process", "truncated", "lost_bytes", "recovered_frames", "file_size", "compression_ratio",
                        "blobs")):
    return {k: v for k, v in a.items() if k not in ignore} == {k: v for k, v in b.items() if k not in ignore}


def test_index_summary_is_used_and_matches_a_scan(tmp_path, monkeypatch):
    p = make_session(tmp_path / "s.cusnap", frame_bytes=300)
    with SnapshotReader(p) as r:
        sm = r.summary()
        assert sm is not None and check_map(sm) is None and sm["records"] == r.stats["records"]
        scanned = summarize(r)        # first with the summary, below without it
        r.index.pop("summary")
        assert summarize(r) == scanned
    assert scanned["kernels"]["by_name"] == {"gemm_kernel": 5, "relu": 1}
    assert scanned["module_images"] and scanned["modules"]["loads"] == 2
    # no record is decoded when the summary is there
    monkeypatch.setattr(SnapshotReader, "records", lambda self, kinds=None: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(SnapshotReader, "header", property(lambda self: dict(self.raw_header)))
    with SnapshotReader(p) as r:
        assert summarize(r)["calls"] == scanned["calls"]


def test_no_index_or_a_cut_one_falls_back_to_a_scan(tmp_path):
    full = make_session(tmp_path / "full.cusnap", frame_bytes=300)
    _res, want = _info(full)
    crashed = make_session(tmp_path / "crash.cusnap", close=False, frame_bytes=300)   # no index at all
    res, got = _info(crashed)
    assert res.exit_code == 0 and got["truncated"] and _same(want, got), _stderr(res)
    cut = tmp_path / "cut.cusnap"
    cut.write_bytes(full.read_bytes()[:-TRAILER_SIZE - 5])                           # index frame cut off
    res, got = _info(cut)
    assert res.exit_code == 0 and got["truncated"] and _same(want, got), _stderr(res)


def _rewrite_index(src, dst, change):
    """dst = src with its index map changed by change(idx), checksums valid."""
    data = src.read_bytes()
    _magic, off, _ = TRAILER.unpack(data[-TRAILER_SIZE:])
    with SnapshotReader(src) as r:
        idx = dict(r.index)
    change(idx)
    raw = new_packer().pack(idx)
    codec, stored = encode_payload(raw, 3)
    head = pack_frame_header(KIND_INDEX, codec, len(raw), stored, 0)
    dst.write_bytes(data[:off] + head + stored + TRAILER.pack(TRAILER_MAGIC, off, xxh64(stored)))
    assert len(head) == FRAME_SIZE


def test_malformed_summary_is_a_clear_error_and_repair_clears_it(tmp_path):
    good = make_session(tmp_path / "good.cusnap")
    _res, want = _info(good)
    for name, change in {"not_a_map": lambda i: i.__setitem__("summary", [1, 2]),
                         "bad_count": lambda i: i["summary"]["calls"].__setitem__("cuInit", "many"),
                         "bad_version": lambda i: i["summary"].__setitem__("v", 99),
                         "bad_fns": lambda i: i["summary"].__setitem__("fns", [[1]])}.items():
        bad = tmp_path / f"{name}.cusnap"
        _rewrite_index(good, bad, change)
        with SnapshotReader(bad) as r:
            assert not r.truncated                  # the index itself verifies
        res, _ = _info(bad)
        err = _stderr(res).strip()
        assert res.exit_code == 2 and err.startswith("cudasnap: error: ") and "\n" not in err, (name, err)
        assert "index summary is malformed" in err and "cudasnap repair" in err, err
    res = runner.invoke(app, ["repair", str(bad)])
    assert res.exit_code == 0, res.output
    res, got = _info(bad)       # the repaired file has a `repair` record more, the same calls
    assert res.exit_code == 0 and not got["truncated"], _stderr(res)
    assert all(got[k] == want[k] for k in ("calls", "kernels", "memory", "modules", "module_images", "end"))


def test_index_without_summary_reads_as_before(tmp_path):
    good = make_session(tmp_path / "good.cusnap")
    old = tmp_path / "old.cusnap"
    _rewrite_index(good, old, lambda i: i.pop("summary"))
    _res, want = _info(good)
    res, got = _info(old)
    assert res.exit_code == 0 and not got["truncated"] and _same(want, got)
