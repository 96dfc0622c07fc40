"""cudasnap.campaign: regression campaigns, snapshots x environments x GPUs, on Ray.

    from cudasnap.campaign import load_campaign, Store
    camp = load_campaign("nightly.toml")      # plan.py: the campaign file -> cells
    store = Store("nightly.sqlite")           # store.py: the append-only SQLite store (SCHEMA.md)

`cudasnap campaign run|report` parse their options in cli/campaign_cmd.py; run.py runs a campaign
start to end, engine.py its cells on Ray (worker.py, cellserver.py on the nodes), rules.py decides
reruns, confirmations and verdicts, report.py reads the store; bisect.py is `cudasnap bisect`."""
from __future__ import annotations

from .plan import Campaign, PlanError, load_campaign  # noqa: F401
from .store import Store, StoreError  # noqa: F401

__all__ = ["Campaign", "PlanError", "load_campaign", "Store", "StoreError"]
