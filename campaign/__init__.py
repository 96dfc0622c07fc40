"""cudasnap.campaign: regression campaigns, snapshots x environments x GPUs, on Ray.

    from cudasnap.campaign import load_campaign, Store
    camp = load_campaign("nightly.toml")      # plan.py: the campaign file -> cells
    store = Store("nightly.sqlite")           # store.py: the append-only SQLite store (SCHEMA.md)

`cudasnap campaign run|report` (cli/campaign_cmd.py) are the command-line faces; engine.py runs
the cells on Ray, rules.py decides reruns and confirmations, report.py reads the store."""
from __future__ import annotations

from .plan import Campaign, PlanError, load_campaign  # noqa: F401
from .store import Store, StoreError  # noqa: F401

__all__ = ["Campaign", "PlanError", "load_campaign", "Store", "StoreError"]
