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


def numerics_text(n: Optional[Dict[str, Any]]) -> str:
    """'numerics CLOSE: max rel 1.2e-07, 1 ULP' (empty for EXACT or unknown)."""
    if not n or n.get("outcome") in (None, "EXACT"):
        return ""
    t = f"numerics {n['outcome']}"
    bits = []
    if isinstance(n.get("max_rel"), (int, float)):
        bits.append(f"max rel {n['max_rel']:.2g}")
    if n.get("max_ulp"):
        bits.append(f"{n['max_ulp']} ULP")
    if n.get("tolerance") and n["outcome"] == "CLOSE":
        bits.append(f"within {n['tolerance']}")
    if n.get("nondeterministic"):
        bits.append("varies run to run")
    return t + (f": {', '.join(bits)}" if bits else "")
