"""How the campaign's reports word a verdict's numbers (the text and HTML reports share them)."""
from __future__ import annotations

from typing import Any, Dict

from cudasnap.compare.render import pct  # noqa: F401  (the reports' percent, as compare words it)

NOISE_EXCEEDS = "noise exceeds the rules"


def controls_line(ctl: Dict[str, Any]) -> str:
    if not ctl["cells"]:
        return "controls: none (an env with control = true measures the false-verdict rate)"
    s = (f"controls: {ctl['verdicts']} verdict(s) in {ctl['comparisons']} kernel comparisons "
         f"({ctl['cells']} cells of env {', '.join(ctl['envs'])})")
    if ctl["withdrawn"]:
        s += f"; {ctl['withdrawn']} more withdrawn by their confirmation"
    return s


def p_text(v) -> str:
    return "-" if v is None else f"{v:.2g}"


def confirm_text(v: Dict[str, Any]) -> str:
    note = v.get("confirm_note") or "no confirmation"
    if v.get("confirm_gpu"):
        note += f" ({v['confirm_gpu']}: {pct(v.get('confirm_diff_pct'), True)}, p={p_text(v.get('confirm_p_value'))})"
    return note
