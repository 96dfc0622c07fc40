"""The campaign store: one SQLite file, appended to by every run (schema: SCHEMA.md).

Each finished cell is written in its own transaction (cell, its kernels, its profile), so an
interrupted campaign leaves only whole cells; attempts are written as they end. A run's own
row is the one row updated in place: its end, status, hosts and session count."""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import statistics
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import zstandard

SCHEMA_VERSION = 2

TABLES: Dict[str, List[str]] = {
    "meta": ["key", "value"],
    "runs": ["id", "campaign", "campaign_path", "campaign_hash", "baseline", "rules", "started", "ended", "status",
             "hosts", "cudasnap_version", "address", "sessions", "exit_code"],
    "cells": ["id", "run_id", "cell_key", "snapshot", "snapshot_digest", "snapshot_id", "kernels", "mode", "env",
              "env_json", "is_baseline", "baseline_cell_id", "gpu_req", "gpu_model", "device_uuid", "driver_version",
              "libcuda", "host", "status", "verdict", "regressed", "exit_code", "attempts", "reruns", "confirmed",
              "wall_s", "replay_s", "error", "finished", "control", "gpu", "confirm_gpu", "confirm_device_uuid",
              "confirm_note", "numerics"],
    "kernel_results": ["id", "cell_id", "kernel", "launches", "median_us", "noise_pct", "base_median_us",
                       "base_noise_pct", "ratio", "diff_pct", "verdict", "why", "p_value", "campaign_noise_pct", "bar_pct",
                       "gpu_offset_pct", "confirm_diff_pct", "confirm_p_value"],
    "attempts": ["id", "run_id", "cell_key", "n", "purpose", "outcome", "exit_code", "host", "node_id", "gpu_uuid",
                 "visible_devices", "queue_s", "proc_s", "wall_s", "error", "started", "ended", "side", "round"],
    "profiles": ["cell_id", "encoding", "data"],
}

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY, campaign TEXT NOT NULL, campaign_path TEXT, campaign_hash TEXT NOT NULL,
  baseline TEXT, rules TEXT, started TEXT NOT NULL, ended TEXT, status TEXT NOT NULL, hosts TEXT,
  cudasnap_version TEXT, address TEXT, sessions INTEGER NOT NULL DEFAULT 1, exit_code INTEGER);
CREATE TABLE IF NOT EXISTS cells (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), cell_key TEXT NOT NULL,
  snapshot TEXT NOT NULL, snapshot_digest TEXT NOT NULL, snapshot_id TEXT, kernels TEXT, mode TEXT NOT NULL,
  env TEXT NOT NULL, env_json TEXT NOT NULL, is_baseline INTEGER NOT NULL, baseline_cell_id INTEGER,
  gpu_req TEXT, gpu_model TEXT, device_uuid TEXT, driver_version INTEGER, libcuda TEXT, host TEXT,
  status TEXT NOT NULL, verdict TEXT NOT NULL, regressed INTEGER NOT NULL, exit_code INTEGER,
  attempts INTEGER NOT NULL, reruns INTEGER NOT NULL, confirmed INTEGER, wall_s REAL, replay_s REAL,
  error TEXT, finished TEXT NOT NULL, control INTEGER NOT NULL DEFAULT 0, gpu TEXT, confirm_gpu TEXT,
  confirm_device_uuid TEXT, confirm_note TEXT, numerics TEXT, UNIQUE (run_id, cell_key));
CREATE TABLE IF NOT EXISTS kernel_results (
  id INTEGER PRIMARY KEY, cell_id INTEGER NOT NULL REFERENCES cells(id), kernel TEXT NOT NULL,
  launches INTEGER, median_us REAL, noise_pct REAL, base_median_us REAL, base_noise_pct REAL, ratio REAL,
  diff_pct REAL, verdict TEXT, why TEXT, p_value REAL, campaign_noise_pct REAL, bar_pct REAL, gpu_offset_pct REAL,
  confirm_diff_pct REAL, confirm_p_value REAL);
CREATE TABLE IF NOT EXISTS attempts (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), cell_key TEXT NOT NULL, n INTEGER NOT NULL,
  purpose TEXT NOT NULL, outcome TEXT NOT NULL, exit_code INTEGER, host TEXT, node_id TEXT, gpu_uuid TEXT,
  visible_devices TEXT, queue_s REAL, proc_s REAL, wall_s REAL, error TEXT, started TEXT, ended TEXT, side TEXT,
  round INTEGER);
CREATE TABLE IF NOT EXISTS profiles (
  cell_id INTEGER PRIMARY KEY REFERENCES cells(id), encoding TEXT NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS cells_by_snapshot ON cells (snapshot_digest, env);
CREATE INDEX IF NOT EXISTS kernels_by_cell ON kernel_results (cell_id);
CREATE INDEX IF NOT EXISTS attempts_by_cell ON attempts (run_id, cell_key);
"""


# columns schema version 2 added (paired verdicts, controls): a version 1 store gains them, empty
_ADDED_IN_2 = {
    "cells": [("control", "INTEGER NOT NULL DEFAULT 0"), ("gpu", "TEXT"), ("confirm_gpu", "TEXT"),
              ("confirm_device_uuid", "TEXT"), ("confirm_note", "TEXT")],
    "kernel_results": [("p_value", "REAL"), ("campaign_noise_pct", "REAL"), ("bar_pct", "REAL"),
                       ("gpu_offset_pct", "REAL"), ("confirm_diff_pct", "REAL"), ("confirm_p_value", "REAL")],
    "attempts": [("side", "TEXT"), ("round", "INTEGER")],
}


# columns added within version 2 (optional: readers of an older store see None)
_ADDED_LATER = {"cells": [("numerics", "TEXT")]}

_DEFAULTS = {"control": 0}


def _upgrade_1_to_2(db) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        for table, cols in [*_ADDED_IN_2.items(), *_ADDED_LATER.items()]:
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for name, decl in cols:
                if name not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


class StoreError(Exception):
    """A store that cannot be opened or is not a campaign store (one line)."""


def now_iso(t: Optional[float] = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


# the types a column of the schema holds (SQLite keeps whatever a writer gave): what a reader
# may count on; BLOB columns hold anything
_HOLDS = {"INTEGER": ("integer", "null"), "REAL": ("integer", "real", "null"), "TEXT": ("text", "null")}
_AS = {"INTEGER": "an integer", "REAL": "a number", "TEXT": "text"}


def _header(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(100)


class Store:
    def __init__(self, path, create: bool = True, defer: bool = False):
        """Open (create: or make) the store at path. A file that is there is looked at read-only
        first: one that is not a campaign store is refused untouched (mode, size, journal).
        defer: a store not there yet is made on the first write (a campaign that fails to
        start leaves none); until then reads see an empty store."""
        self.path = os.fspath(path)
        if not create and not os.path.isfile(self.path):
            raise StoreError(f"{self.path}: no such store")
        if os.path.isdir(self.path):
            raise StoreError(f"{self.path} is a directory: give a store file")
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"{self.path}: no such directory {parent} (create it first)")
        self._pending = False
        empty = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if empty and not create:
            raise StoreError(f"{self.path}: an empty file, not a campaign store")
        if not empty:
            try:
                head = _header(self.path)
            except OSError as e:
                raise StoreError(f"{self.path}: cannot read ({e.strerror or e})")
            if not head.startswith(b"SQLite format 3\0"):
                raise StoreError(f"{self.path}: not an SQLite store (file is not a database)")
            self.wal = len(head) > 19 and head[18] == 2
            # a rollback-journal file opens read-only without a trace; a WAL file's reader makes
            # -wal/-shm beside it, which the last connection to close removes (read-only cannot)
            look = self._connect(readonly=not self.wal)
            try:
                self._check(look, create)
            finally:
                look.close()
            if not create:
                self.db = self._connect(readonly=not self.wal)
                if self._version() == "1":      # read in memory, upgraded there: the file stays as it was
                    mem = sqlite3.connect(":memory:", isolation_level=None)
                    self.db.backup(mem)
                    self.db.close()
                    mem.row_factory = sqlite3.Row
                    self.db = mem
                    self._upgrade()
                return
        elif defer and not os.path.exists(self.path):
            self._pending = True
            self.db = sqlite3.connect(":memory:", isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.executescript(_DDL)
            self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        self._open_for_writing()

    def _connect(self, readonly: bool):
        try:
            if readonly:
                from urllib.parse import quote
                db = sqlite3.connect(f"file:{quote(os.path.abspath(self.path))}?mode=ro", uri=True, timeout=30,
                                     isolation_level=None)
            else:
                db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
            return db
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not an SQLite store ({e})")

    def _check(self, db, create: bool) -> None:
        """Refuse a database that is not a campaign store of this schema (it is left as it was);
        create: a database without a table may become one."""
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables and create:
                return
            if not tables:
                raise StoreError(f"{self.path}: an empty SQLite file, not a campaign store")
            if "runs" not in tables or "meta" not in tables:
                raise StoreError(f"{self.path}: an SQLite file, but not a campaign store")
            v = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not an SQLite store ({e})")
        if v is None or str(v[0]) not in ("1", str(SCHEMA_VERSION)):    # 1: upgraded on opening
            raise StoreError(f"{self.path}: store schema version {v[0] if v else '?'}, this cudasnap reads {SCHEMA_VERSION}")

    def _open_for_writing(self) -> None:
        self.db = self._connect(readonly=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(_DDL)         # idempotent: IF NOT EXISTS
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot write the store ({e})")
        if self._version() == "1":
            self._upgrade()
        for table, cols in _ADDED_LATER.items():
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            for name, decl in cols:
                if name not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        self._pending = False

    def _version(self) -> Optional[str]:
        v = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return None if v is None else str(v[0])

    def _upgrade(self) -> None:
        try:
            _upgrade_1_to_2(self.db)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: a version 1 store that cannot be upgraded to version 2 ({e})")

    def value_problem(self) -> Optional[str]:
        """The first value of a type its column does not hold (a store edited or damaged by
        hand), named by table, row and column; None when every value fits."""
        for (table,) in self.db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"):
            for col in self.db.execute(f"PRAGMA table_info({table})").fetchall():
                name, decl = col[1], (col[2] or "").upper()
                if decl not in _HOLDS:
                    continue
                kinds = ", ".join(f"'{k}'" for k in _HOLDS[decl])
                bad = self.db.execute(f"SELECT rowid, {name}, typeof({name}) FROM {table} "
                                      f"WHERE typeof({name}) NOT IN ({kinds}) LIMIT 1").fetchone()
                if bad is not None:
                    return (f"{table} row {bad[0]}: {name} is {bad[2]} ({bad[1]!r:.40}), "
                            f"not {_AS[decl]}")
        return None

    # ------------------------------------------------------------------ transactions
    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, et, ev, tb):
            self.db.execute("COMMIT" if et is None else "ROLLBACK")
            return False

    def tx(self):
        if self._pending:                   # the first write makes the file (defer)
            self.db.close()
            self._open_for_writing()
        return Store._Tx(self.db)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ runs
    def open_run(self, campaign, version: str, address: Optional[str], fresh: bool) -> (int, bool):
        """The run to continue (the latest run of this campaign file: its finished cells are
        skipped) or, when fresh or there is none, a new one. Returns (run id, resumed)."""
        r = None if fresh else self.latest_run(campaign)
        if r is not None:
            with self.tx() as db:
                db.execute("UPDATE runs SET sessions=sessions+1, status='running', ended=NULL WHERE id=?", (r,))
            return r, True
        rules = json.dumps(campaign.rules.__dict__)
        with self.tx() as db:
            cur = db.execute("INSERT INTO runs (campaign, campaign_path, campaign_hash, baseline, rules, started, status,"
                             " hosts, cudasnap_version, address) VALUES (?,?,?,?,?,?,?,?,?,?)",
                             (campaign.name, campaign.path, campaign.file_hash, campaign.baseline, rules, now_iso(),
                              "running", json.dumps([socket.gethostname()]), version, address))
            return cur.lastrowid, False

    def latest_run(self, campaign) -> Optional[int]:
        """The run open_run would continue (read only): the latest of this campaign file."""
        r = self.db.execute("SELECT id FROM runs WHERE campaign_hash=? ORDER BY id DESC LIMIT 1",
                            (campaign.file_hash,)).fetchone()
        return None if r is None else r[0]

    def close_run(self, run_id: int, status: str, hosts: Iterable[str], exit_code: Optional[int]) -> None:
        row = self.db.execute("SELECT hosts FROM runs WHERE id=?", (run_id,)).fetchone()
        old = json.loads(row[0]) if row and row[0] else []
        allh = sorted(set(old) | set(h for h in hosts if h))
        with self.tx() as db:
            db.execute("UPDATE runs SET ended=?, status=?, hosts=?, exit_code=? WHERE id=?",
                       (now_iso(), status, json.dumps(allh), exit_code, run_id))

    def finished_keys(self, run_id: int) -> Dict[str, int]:
        return {r[0]: r[1] for r in self.db.execute("SELECT cell_key, id FROM cells WHERE run_id=?", (run_id,))}

    # ---- what the report reads (campaign/report.py runs no SQL of its own)
    def run_row(self, run_id: int) -> Optional[sqlite3.Row]:
        return self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()

    def run_cells(self, run_id: int) -> List[sqlite3.Row]:
        return self.db.execute("SELECT * FROM cells WHERE run_id=? ORDER BY id", (run_id,)).fetchall()

    def cell_row(self, cell_id: int) -> Optional[sqlite3.Row]:
        return self.db.execute("SELECT * FROM cells WHERE id=?", (cell_id,)).fetchone()

    def baseline_cell_of(self, run_id: int, digest: str, mode: str, kernels: Optional[str]) -> Optional[sqlite3.Row]:
        """The run's baseline cell of a snapshot (mode, kernels)."""
        return self.db.execute("SELECT * FROM cells WHERE run_id=? AND is_baseline=1 AND snapshot_digest=? AND mode=?"
                               " AND kernels IS ?", (run_id, digest, mode, kernels)).fetchone()

    def cell_history(self, digest: str, env: str, mode: str, kernels: Optional[str], upto_run: int) -> List[sqlite3.Row]:
        """The cells of one snapshot x env in every run up to upto_run, oldest first, with the run's start."""
        return self.db.execute("SELECT c.*, r.started AS run_started FROM cells c JOIN runs r ON r.id=c.run_id"
                               " WHERE c.snapshot_digest=? AND c.env=? AND c.mode=? AND c.kernels IS ? AND c.run_id<=?"
                               " ORDER BY c.run_id, c.id", (digest, env, mode, kernels, upto_run)).fetchall()

    def kernel_results(self, cell_id: int) -> List[Dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM kernel_results WHERE cell_id=? ORDER BY id", (cell_id,))]

    def kernel_result(self, cell_id: int, kernel: str) -> Optional[sqlite3.Row]:
        return self.db.execute("SELECT * FROM kernel_results WHERE cell_id=? AND kernel=?", (cell_id, kernel)).fetchone()

    def cell_attempts(self, run_id: int, cell_key: str) -> List[Dict[str, Any]]:
        """The replays of a cell: side, round, purpose, GPU, outcome and times."""
        q = ("SELECT n, purpose, side, round, outcome, host, visible_devices, gpu_uuid, proc_s, started FROM attempts "
             "WHERE run_id=? AND cell_key=? ORDER BY n")
        return [dict(r) for r in self.db.execute(q, (run_id, cell_key))]

    def kernel_medians(self, run_ids: List[int]) -> List[sqlite3.Row]:
        """Every kernel's median in the runs, by run, cell and kernel."""
        if not run_ids:
            return []
        # a store from before cells.numerics, read only, has none
        num = "c.numerics" if "numerics" in {r[1] for r in self.db.execute("PRAGMA table_info(cells)")} else "NULL"
        q = ("SELECT c.run_id, c.snapshot, c.snapshot_digest, c.env, c.mode, k.kernel, k.median_us, k.noise_pct,"
             f" k.verdict, {num} AS numerics FROM kernel_results k JOIN cells c ON c.id=k.cell_id"
             f" WHERE c.run_id IN ({','.join('?' * len(run_ids))}) ORDER BY c.run_id, c.id, k.id")
        return self.db.execute(q, run_ids).fetchall()

    def runs(self, since: Optional[str] = None) -> List[sqlite3.Row]:
        if since:
            return list(self.db.execute("SELECT * FROM runs WHERE started >= ? ORDER BY id", (since,)))
        return list(self.db.execute("SELECT * FROM runs ORDER BY id"))

    def resolve_run(self, spec: str, campaign: str, exclude: int) -> Optional[int]:
        """run:latest (the latest other run of this campaign) or run:N."""
        if spec == "run:latest":
            r = self.db.execute("SELECT id FROM runs WHERE campaign=? AND id<>? ORDER BY id DESC LIMIT 1",
                                (campaign, exclude)).fetchone()
        else:
            r = self.db.execute("SELECT id FROM runs WHERE id=?", (int(spec[4:]),)).fetchone()
        return r[0] if r else None

    # ------------------------------------------------------------------ cells
    def add_attempt(self, run_id: int, cell_key: str, a: Dict[str, Any]) -> None:
        with self.tx() as db:
            n = db.execute("SELECT COUNT(*) FROM attempts WHERE run_id=? AND cell_key=?", (run_id, cell_key)).fetchone()[0]
            db.execute("INSERT INTO attempts (run_id, cell_key, n, purpose, outcome, exit_code, host, node_id, gpu_uuid,"
                       " visible_devices, queue_s, proc_s, wall_s, error, started, ended, side, round)"
                       " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (run_id, cell_key, n + 1, a.get("purpose"), a.get("outcome"), a.get("exit_code"), a.get("host"),
                        a.get("node_id"), a.get("gpu_uuid"), a.get("visible_devices"), a.get("queue_s"),
                        a.get("proc_s"), a.get("wall_s"), a.get("error"), a.get("started"), a.get("ended"),
                        a.get("side"), a.get("round")))

    def add_cell(self, run_id: int, c: Dict[str, Any], kernels: List[Dict[str, Any]],
                 profile: Optional[Dict[str, Any]]) -> int:
        """The whole cell in one transaction."""
        cols = TABLES["cells"][2:]
        with self.tx() as db:
            cur = db.execute(f"INSERT INTO cells (run_id, {', '.join(cols)}) VALUES (?{', ?' * len(cols)})",
                             [run_id] + [c.get(k, _DEFAULTS.get(k)) if c.get(k) is not None else _DEFAULTS.get(k)
                                         for k in cols])
            cid = cur.lastrowid
            kc = TABLES["kernel_results"][2:]
            db.executemany(f"INSERT INTO kernel_results (cell_id, {', '.join(kc)}) VALUES (?{', ?' * len(kc)})",
                           [[cid] + [k.get(x) for x in kc] for k in kernels])
            if profile is not None:
                data = zstandard.ZstdCompressor(level=9).compress(json.dumps(profile, separators=(",", ":")).encode())
                db.execute("INSERT INTO profiles VALUES (?, 'zstd+json', ?)", (cid, data))
            return cid

    def profile(self, cell_id: int) -> Optional[Dict[str, Any]]:
        r = self.db.execute("SELECT encoding, data FROM profiles WHERE cell_id=?", (cell_id,)).fetchone()
        if r is None:
            return None
        return json.loads(zstandard.ZstdDecompressor().decompress(r[1]))

    def cell(self, cell_id: int) -> Optional[sqlite3.Row]:
        return self.db.execute("SELECT * FROM cells WHERE id=?", (cell_id,)).fetchone()

    def past_seconds(self) -> Dict[Tuple[str, str, str, Optional[str]], float]:
        """(snapshot digest, env, mode, kernels) -> the median wall time of its finished cells in
        every run so far: how long such a cell takes, for ordering the next run's cells."""
        times: Dict[Tuple[str, str, str, Optional[str]], List[float]] = {}
        for r in self.db.execute("SELECT snapshot_digest, env, mode, kernels, wall_s FROM cells"
                                 " WHERE status='ok' AND wall_s > 0"):
            times.setdefault((r[0], r[1], r[2], r[3]), []).append(float(r[4]))
        return {k: statistics.median(v) for k, v in times.items()}

    def find_cell(self, run_id: int, snapshot_digest: str, env: str, mode: str, kernels: Optional[str]):
        return self.db.execute("SELECT * FROM cells WHERE run_id=? AND snapshot_digest=? AND env=? AND mode=?"
                               " AND kernels IS ? AND status='ok' ORDER BY id DESC LIMIT 1",
                               (run_id, snapshot_digest, env, mode, kernels)).fetchone()
