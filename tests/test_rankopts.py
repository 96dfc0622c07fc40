"""A group replay's rank options travel as one typed document (replay/rankopts.py, replay/rank.py)."""
from __future__ import annotations

import json
import subprocess
import sys

from cudasnap.replay.options import ReplayOptions
from cudasnap.replay.profile import ProfileConfig
from cudasnap.replay import rank, rankopts


def test_rank_options_round_trip_with_the_rank_filled_in(tmp_path):
    doc = str(tmp_path / "options.json")
    opts = ReplayOptions(rtol=1e-3, dtype="f16", replace=["k=a.cubin"], pace="recorded", quiet=True)
    cfg = ProfileConfig(mode="timeline", repeat=4, out="/x/prof.rank{rank}.json", trace="/x/t{rank}.json",
                        hooks=["mod:Hook"], nvtx=False)
    rankopts.dump(doc, opts, cfg)
    o, c = rank.load(doc, 3, 1, 60.0)
    assert (o.device, o.watchdog) == (1, 60.0)
    assert o == ReplayOptions(device=1, watchdog=60.0, rtol=1e-3, dtype="f16", replace=["k=a.cubin"],
                              pace="recorded", quiet=True)
    assert c.out == "/x/prof.rank3.json" and c.trace == "/x/t3.json"
    assert c.hooks == [rankopts.RANK_HOOK, "mod:Hook"] and c.repeat == 4 and c.nvtx is False


def test_a_bad_document_is_one_line_and_exit_2(tmp_path):
    doc = tmp_path / "options.json"
    doc.write_text(json.dumps({"replay": {"no_such_option": 1}, "profile": {}}))
    cp = subprocess.run([sys.executable, "-m", "cudasnap.replay.rank", str(doc), "x.cusnap", "0", "5.0"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert cp.stderr.strip() == "cudasnap: error: rank options: unknown ReplayOptions field(s): no_such_option"
