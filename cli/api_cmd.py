"""`cudasnap api`: list every driver entry point and whether it is replayed, recorded or refused."""
from __future__ import annotations

import json
import sys
from typing import Dict, List, Optional

STATUSES = ("replay", "record", "refused")


def _replay_handled() -> Optional[Dict[str, str]]:
    """ABI name -> how replay takes it: "skipped" (a query, by class), "class" (a plain call, by
    the description), "handler" (code of its own); None if the replay package cannot say."""
    try:
        from cudasnap.replay import dispatch
        return {n: dispatch.replayed_by(n) for n in dispatch.REPLAY_HANDLED}
    except Exception:
        return None


def entries() -> List[Dict]:
    """One row per ABI entry point, status refined by the replay package when available."""
    from cudasnap.shim.description import load

    d = load()
    handled = _replay_handled()
    rows = []
    for f in d.functions:
        status, reason = f["status"], f["reason"]
        if status == "replay" and handled is not None and f["name"] not in handled:
            status, reason = "record", "not handled by the replayer yet"
        rows.append({"id": f["id"], "name": f["name"], "base": f["base"], "family": f["family"],
                     "status": status, "reason": reason, "capture": f["capture"],
                     "replayed_by": (handled or {}).get(f["name"]) if status == "replay" else None,
                     "classes": f.get("classes", []), "origin": f.get("origin", "header")})
    return rows


def _totals(rows) -> Dict[str, int]:
    t = {s: 0 for s in STATUSES}
    for r in rows:
        t[r["status"]] = t.get(r["status"], 0) + 1
    return t


def run_api(status: Optional[str], json_out: bool) -> int:
    if status is not None and status not in STATUSES:
        print(f"cudasnap: error: --status must be one of {', '.join(STATUSES)}", file=sys.stderr)
        return 2
    try:
        all_rows = entries()
    except Exception as e:  # missing/corrupt description: say so, don't trace back
        print(f"cudasnap: error: cannot load the API description: {e}", file=sys.stderr)
        return 1
    rows = [r for r in all_rows if status is None or r["status"] == status]
    totals = _totals(rows)
    summary = (f"{totals['replay']} recorded and replayable, {totals['record']} recorded only, "
               f"{totals['refused']} refused")
    if json_out:
        from cudasnap.shim.description import load

        d = load()
        json.dump({"source": d.source, "digest": d.digest, "functions": rows, "totals": totals},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    from rich.markup import escape

    from cudasnap.console import console, print_table

    style = {"replay": "green", "record": "yellow", "refused": "red"}
    con = console()
    print_table(con, ["ABI name", "base", "family", "status", "replayed by", "reason"],
                [(escape(r["name"]), escape(r["base"]), escape(r["family"]),
                  f"[{style.get(r['status'], '')}]{escape(r['status'])}[/]", escape(r["replayed_by"] or ""),
                  escape(r["reason"] or ""))
                 for r in rows], title="CUDA Driver API entry points", markup=True)
    con.print(summary, markup=False)
    return 0
