"""The output rule (formats/outputs.py): refused before work, written atomically."""
from __future__ import annotations

import os
import stat

import pytest

from cudasnap.formats.outputs import OutputError, atomic_file, atomic_path, check_output, write_atomic


def _names(d):
    return sorted(p.name for p in d.iterdir())


def test_new_file_in_an_existing_directory(tmp_path):
    assert check_output(tmp_path / "a.json") == str(tmp_path / "a.json")
    assert _names(tmp_path) == []          # the write probe leaves nothing


def test_existing_file_needs_force(tmp_path):
    p = tmp_path / "a.json"
    p.write_text("keep")
    with pytest.raises(OutputError, match=r"exists: use -f \(--force-overwrite\)"):
        check_output(p)
    check_output(p, force=True)
    assert p.read_text() == "keep"         # checking never writes


def test_input_is_never_the_output(tmp_path):
    src = tmp_path / "in.cusnap"
    src.write_bytes(b"x")
    for p in (src, tmp_path / "." / "in.cusnap"):
        with pytest.raises(OutputError, match="is the input"):
            check_output(p, force=True, inputs=[src])
    link = tmp_path / "link.cusnap"
    link.symlink_to(src)
    with pytest.raises(OutputError, match="is the input"):
        check_output(link, force=True, inputs=[src])


def test_missing_parent_is_an_error_not_created(tmp_path):
    with pytest.raises(OutputError, match="no such directory"):
        check_output(tmp_path / "nope" / "a.json", force=True)
    with pytest.raises(OutputError, match="no such directory"):
        check_output(tmp_path / "nope" / "out", force=True, kind="dir")
    assert not (tmp_path / "nope").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="not a directory"):
        check_output(tmp_path / "f" / "a.json", force=True)


def test_directory_for_file_and_file_for_directory(tmp_path):
    with pytest.raises(OutputError, match="is a directory"):
        check_output(tmp_path, force=True)
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match="not a directory"):
        check_output(tmp_path / "f", force=True, kind="dir")


def test_directory_output(tmp_path):
    d = tmp_path / "out"
    check_output(d, kind="dir")               # missing: created later by the command
    d.mkdir()
    check_output(d, kind="dir")               # empty: fine
    (d / "mine.txt").write_text("x")
    with pytest.raises(OutputError, match="not empty"):
        check_output(d, kind="dir")
    check_output(d, force=True, kind="dir")
    assert _names(d) == ["mine.txt"]


def test_unwritable_place():
    with pytest.raises(OutputError, match="cannot write in /proc"):
        check_output("/proc/cudasnap-test.json", force=True)
    with pytest.raises(OutputError):
        check_output("/sys/cudasnap-test", force=True, kind="dir")


def test_atomic_write_replaces_whole_and_keeps_mode(tmp_path):
    p = tmp_path / "a.txt"
    write_atomic(p, "one")
    assert p.read_text() == "one"
    os.chmod(p, 0o600)
    write_atomic(p, b"two")
    assert p.read_bytes() == b"two" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert _names(tmp_path) == ["a.txt"]


def test_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(p, "w") as f:
            f.write("half")
            raise RuntimeError("disk full")
    assert p.read_text() == "old" and _names(tmp_path) == ["a.txt"]
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "b.db") as tmp:
            assert os.path.dirname(tmp) == str(tmp_path) and os.path.getsize(tmp) == 0
            raise KeyboardInterrupt
    assert _names(tmp_path) == ["a.txt"]


def test_new_file_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "n.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "n.txt").stat().st_mode) == 0o640
