"""cudasnap.compare: A/B comparison of profiles and bisection over environments.

    from cudasnap.compare import load_profile, compare
    res = compare(load_profile("a.json"), load_profile("b.json"), threshold=5.0)
    res["kernels"]      # per kernel: medians, spread, noise, ratio, verdict SAME/FASTER/SLOWER
    res["exit_code"]    # 1 when a kernel or the total regressed

`cudasnap compare` (run_compare_cli) and `cudasnap bisect` (bisect.run_bisect_cli) are the
command-line faces; core.py holds the statistics, html.py the report."""
from __future__ import annotations

import json
import sys
from typing import Optional

from cudasnap.formats.console import invoked_command

from .core import FASTER, MIN_DIFF_US, SAME, SLOWER, CompareError, compare, facts, load_profile  # noqa: F401

__all__ = ["compare", "load_profile", "facts", "CompareError", "run_compare_cli", "SAME", "SLOWER", "FASTER"]


def run_compare_cli(base, candidate, threshold: float = 5.0, html: Optional[str] = None, as_json: bool = False,
                    force: bool = False, top: int = 20, out=None, min_diff_us: Optional[float] = None,
                    judge_collectives: bool = False) -> int:
    """Exit 0: no significant regression; 1: a kernel or the total regressed; 2: error."""
    out = out or sys.stdout
    if threshold < 0:
        sys.stderr.write("cudasnap: error: --threshold must be >= 0\n")
        return 2
    if html:
        from .html import need_plotly
        why = need_plotly()
        if why:
            sys.stderr.write(f"cudasnap: error: {why}\n")
            return 2
    if min_diff_us is not None and min_diff_us < 0:
        sys.stderr.write("cudasnap: error: --min-diff-us must be >= 0\n")
        return 2
    try:
        res = compare(load_profile(base), load_profile(candidate), threshold=threshold, force=force,
                      min_diff_us=MIN_DIFF_US if min_diff_us is None else min_diff_us,
                      judge_collectives=judge_collectives)
    except CompareError as e:
        sys.stderr.write(f"cudasnap: error: {e}\n")
        return 2
    if html:
        from .html import write_compare_html
        try:
            write_compare_html(res, html, compare_cmd=invoked_command())
        except OSError as e:
            sys.stderr.write(f"cudasnap: error: cannot write {html}: {e}\n")
            return 2
        res["html"] = str(html)
    if as_json:
        out.write(json.dumps(res, indent=1, default=str) + "\n")
    else:
        from .render import render_text
        render_text(res, out, top)
        if html:
            out.write(f"report written to {html}\n")
    return res["exit_code"]


