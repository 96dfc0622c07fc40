"""Group manifests: the processes of one captured job and the links between them.

A capture of several processes (torchrun, mpirun, mp.spawn) writes one snapshot per process
and a manifest, a small JSON file (`cudasnap_group` key), that names them as ranks with their
pids and GPUs, and the cross-process links the snapshots show:
- shareable handles: a cuMemExportToShareableHandle (POSIX fd) of one process and the
  cuMemImportFromShareableHandle of another that received it. The shim identifies the
  exporter of an imported fd (kcmp against the exporters' duplicates, shim_share.c); where
  that was not possible the import is paired with the newest earlier export of the same file
  (st_dev, st_ino) from another process ("time");
- legacy IPC handles: cuIpcGetMemHandle and cuIpcOpenMemHandle of the same 64 bytes, and
  likewise event handles (cuIpcGetEventHandle, cuIpcOpenEventHandle: "ipc_event");
- peer access: cuCtxEnablePeerAccess calls.
Both capture (writing) and replay (reading, or building one from several snapshots) use it.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .abi import base_name
from .vocab import call_args, in_class
from .reader import SnapshotReader

MANIFEST_KEY = "cudasnap_group"
VERSION = 1
_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "LOCAL_RANK")


class GroupError(Exception):
    """A manifest that cannot be used (message names the problem)."""


def is_manifest(path) -> bool:
    """True when `path` is a group manifest (JSON with the cudasnap_group key)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and MANIFEST_KEY.encode() in head


_base = base_name


def scan(path) -> Dict[str, Any]:
    """What one snapshot contributes: pid, rank hint, devices used, GPUs, exports, imports,
    IPC handles, peer-access calls."""
    with SnapshotReader(path) as r:
        hdr = r.header or {}
        env = hdr.get("env") or {}
        out: Dict[str, Any] = {"pid": hdr.get("pid"), "ppid": hdr.get("ppid"), "created": hdr.get("created"),
                               "started": hdr.get("started"),
                               "snapshot": os.fspath(path),
                               "devices": [], "gpus": [], "exports": [], "imports": [], "ipc_get": [],
                               "ipc_open": [], "peer": []}
        for k in _RANK_ENV:
            if str(env.get(k, "")).isdigit():
                out["rank_env"] = int(env[k])
                break
        devs: List[int] = []
        weight: Dict[int, int] = {}       # device -> allocations made on it (cuMemCreate's location)
        for rec in r.records(("c", "proc", "ctx")):
            k = rec.get("k")
            if k == "proc":
                out["gpus"] = [g.get("uuid") for g in rec.get("gpus") or []]
                continue
            if k == "ctx":
                d = rec.get("device")
                if isinstance(d, int) and d not in devs:
                    devs.append(d)
                continue
            if rec.get("r") != 0:
                continue
            b = _base(rec.get("f") or "")
            a = call_args(rec)
            x = rec.get("x") if isinstance(rec.get("x"), dict) else {}
            if in_class(b, "makes_context") and isinstance(a.get("dev"), int) and a["dev"] not in devs:
                devs.append(a["dev"])
            elif in_class(b, "physical_memory") and isinstance(a.get("prop"), (bytes, bytearray)) and len(a["prop"]) >= 16:
                ltype, lid = struct.unpack_from("<Ii", a["prop"], 8)
                if ltype == 1:            # CU_MEM_LOCATION_TYPE_DEVICE
                    weight[lid] = weight.get(lid, 0) + 1
            elif in_class(b, "exports_shareable"):
                link = x.get("link") or {}
                out["exports"].append({"seq": rec.get("s"), "t": rec.get("t1") or rec.get("t0"), "fd": a.get("shareableHandle"),
                                       "handle": a.get("handle"), "type": a.get("handleType"),
                                       "export": link.get("export"), "dev": link.get("dev"), "ino": link.get("ino")})
            elif in_class(b, "imports_shareable"):
                link = x.get("link") or {}
                out["imports"].append({"seq": rec.get("s"), "t": rec.get("t0"), "fd": a.get("osHandle"),
                                       "handle": a.get("handle"), "type": a.get("shHandleType"),
                                       "peer_pid": link.get("peer_pid"), "peer_export": link.get("peer_export"),
                                       "dev": link.get("dev"), "ino": link.get("ino"),
                                       "match_errno": link.get("match_errno")})
            elif in_class(b, "gets_ipc"):
                h = a.get("pHandle")
                out["ipc_get"].append({"seq": rec.get("s"), "dptr": a.get("dptr"), "event": in_class(b, "ipc_event"),
                                       "handle": h.hex() if isinstance(h, (bytes, bytearray)) else None})
            elif in_class(b, "opens_ipc"):
                h = a.get("handle")
                out["ipc_open"].append({"seq": rec.get("s"), "dptr": a.get("pdptr"), "event": in_class(b, "ipc_event"),
                                        "handle": h.hex() if isinstance(h, (bytes, bytearray)) else None})
            elif in_class(b, "enables_peer"):
                out["peer"].append({"seq": rec.get("s"), "peer_ctx": a.get("peerContext")})
        # the rank's own GPU first: LOCAL_RANK's when it used it (torchrun), else where it allocated most
        local = env.get("LOCAL_RANK")
        main = int(local) if str(local or "").isdigit() and int(local) in devs else \
            max(devs, key=lambda d: (weight.get(d, 0), -devs.index(d))) if devs else None
        out["devices"] = ([main] + [d for d in devs if d != main]) if main is not None else devs
    return out


def build(snapshots: Sequence, command: Optional[List[str]] = None) -> Dict[str, Any]:
    """A manifest for these snapshots (one per process). Ranks are ordered by the rank their
    environment named (RANK, OMPI_COMM_WORLD_RANK, LOCAL_RANK), else in the order the processes
    first called the driver (then by pid)."""
    scans = [scan(p) for p in snapshots]
    # pids wrap and the recorder notices processes late, so processes without a rank go in
    # the order their shim started recording (a parent before the child it forks)
    scans.sort(key=lambda s: (s.get("rank_env") if s.get("rank_env") is not None else 1 << 30,
                              s.get("started") or s.get("created") or 0.0, s.get("pid") or 0))
    links: List[Dict[str, Any]] = []
    unmatched: List[Dict[str, Any]] = []
    by_key = {(s["pid"], e["export"]): e for s in scans for e in s["exports"] if e.get("export") is not None}
    used = set()
    for s in scans:
        for im in s["imports"]:
            src = None
            how = None
            if im.get("peer_pid") and (im["peer_pid"], im.get("peer_export")) in by_key:
                src, how = (im["peer_pid"], im["peer_export"]), "kcmp"
            else:
                # the newest earlier export of the same file from another process, not yet taken
                best = None
                for o in scans:
                    if o["pid"] == s["pid"]:
                        continue
                    for e in o["exports"]:
                        key = (o["pid"], e.get("export"))
                        if e.get("export") is None or key in used or e.get("ino") != im.get("ino") \
                                or e.get("dev") != im.get("dev") or (e.get("t") or 0) > (im.get("t") or 0):
                            continue
                        if best is None or (e.get("t") or 0) > best[0]:
                            best = ((e.get("t") or 0), key)
                if best is not None:
                    src, how = best[1], "time"
            if src is None:
                unmatched.append({"pid": s["pid"], "seq": im["seq"], "fd": im.get("fd"),
                                  "why": "no export of this file was recorded in another process"})
                continue
            used.add(src)
            e = by_key[src]
            links.append({"kind": "shareable", "matched_by": how,
                          "from": {"pid": src[0], "export": src[1], "seq": e["seq"]},
                          "to": {"pid": s["pid"], "seq": im["seq"], "fd": im.get("fd")}})
    gets = {(bool(g.get("event")), g["handle"]): (s["pid"], g) for s in scans for g in s["ipc_get"] if g.get("handle")}
    for s in scans:
        for op in s["ipc_open"]:
            ev = bool(op.get("event"))
            src = gets.get((ev, op.get("handle")))
            if src is None:
                unmatched.append({"pid": s["pid"], "seq": op["seq"],
                                  "why": f"IPC {'event ' if ev else ''}handle not exported by a recorded process"})
                continue
            links.append({"kind": "ipc_event" if ev else "ipc", "handle": op["handle"],
                          "from": {"pid": src[0], "seq": src[1]["seq"], "dptr": src[1]["dptr"]},
                          "to": {"pid": s["pid"], "seq": op["seq"], "dptr": op["dptr"]}})
    # a process that used no GPU (a launcher that only initialized the driver) is not a rank
    gpu_procs = [s for s in scans if s["devices"] or s["exports"] or s["imports"] or s["ipc_get"] or s["ipc_open"]]
    others = [{"pid": s["pid"], "snapshot": s["snapshot"]} for s in scans if gpu_procs and s not in gpu_procs]
    ranks = []
    for i, s in enumerate(gpu_procs or scans):
        ranks.append({"rank": i, "pid": s["pid"], "snapshot": s["snapshot"], "devices": s["devices"],
                      "gpus": s["gpus"], **({"rank_env": s["rank_env"]} if s.get("rank_env") is not None else {}),
                      "peer_access": len(s["peer"])})
    return {MANIFEST_KEY: VERSION, "command": command, "ranks": ranks, "links": links, "unmatched": unmatched,
            **({"other_processes": others} if others else {})}


def save(manifest: Dict[str, Any], path) -> None:
    """Write it with snapshot paths relative to the manifest's directory."""
    path = Path(path)
    m = json.loads(json.dumps(manifest))
    for r in m["ranks"]:
        try:
            r["snapshot"] = os.path.relpath(r["snapshot"], path.parent.resolve())
        except ValueError:
            pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(m, indent=1) + "\n")
    os.replace(tmp, path)


def load(path) -> Dict[str, Any]:
    """Read a manifest; snapshot paths come back absolute. GroupError when it is not one."""
    path = Path(path)
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise GroupError(f"{path}: not a readable group manifest ({e})")
    if not isinstance(m, dict) or m.get(MANIFEST_KEY) != VERSION or not isinstance(m.get("ranks"), list):
        raise GroupError(f"{path}: not a cudasnap group manifest (version {VERSION})")
    why = manifest_problem(m)
    if why:
        raise GroupError(f"{path}: a damaged group manifest: {why}")
    for r in m["ranks"]:
        r["snapshot"] = os.fspath((path.parent / r["snapshot"]).resolve())
    return m


def _kind(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a map"}.get(type(v), "null" if v is None else type(v).__name__)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# (key, test, what it must be, required) for a rank, and for each end of a link
_RANK_FIELDS = (("rank", lambda v: _int(v) and v >= 0, "a rank number", True),
                ("pid", lambda v: v is None or _int(v), "a process id", True),
                ("snapshot", lambda v: isinstance(v, str) and v != "", "a snapshot path", True),
                ("devices", lambda v: isinstance(v, list) and all(_int(d) and d >= 0 for d in v), "a list of device numbers", False),
                ("gpus", lambda v: isinstance(v, list) and all(g is None or isinstance(g, str) for g in v), "a list of GPU ids",
                 False),
                ("rank_env", _int, "an integer", False),
                ("peer_access", _int, "a count", False))
_END_FIELDS = (("pid", _int, "a process id", True), ("seq", _int, "a call number", True),
               ("export", _int, "an export number", False), ("fd", lambda v: v is None or _int(v), "an fd", False),
               ("dptr", lambda v: v is None or _int(v), "an address", False))


def _fields_problem(d, fields, where: str) -> Optional[str]:
    """The first field of map `d` (at `where`) missing or of the wrong kind, named."""
    if not isinstance(d, dict):
        return f"{where} is {_kind(d)}, not a map"
    for key, ok, what, required in fields:
        if key not in d:
            if required:
                return f"{where} has no {key}"
        elif not ok(d[key]):
            return f"{where}.{key} is {_kind(d[key])} ({d[key]!r:.40}), not {what}"
    return None


def manifest_problem(m: Dict[str, Any]) -> Optional[str]:
    """The first part of a manifest of the wrong shape (what build writes), named; None when
    its shape is right."""
    if m.get("command") is not None and not (isinstance(m["command"], list)
                                             and all(isinstance(a, str) for a in m["command"])):
        return f"command is {_kind(m['command'])}, not a list of arguments"
    seen: Dict[Any, int] = {}
    for i, r in enumerate(m["ranks"]):
        why = _fields_problem(r, _RANK_FIELDS, f"ranks[{i}]")
        if why:
            return why
        if r["rank"] in seen:
            return f"ranks[{i}] and ranks[{seen[r['rank']]}] are both rank {r['rank']}"
        seen[r["rank"]] = i
    for name in ("links", "unmatched", "other_processes"):
        if name in m and not isinstance(m[name], list):
            return f"{name} is {_kind(m[name])}, not a list"
    for i, ln in enumerate(m.get("links") or []):
        if not isinstance(ln, dict):
            return f"links[{i}] is {_kind(ln)}, not a map"
        if not isinstance(ln.get("kind"), str):
            return f"links[{i}].kind is {_kind(ln.get('kind'))}, not a link kind"
        for end in ("from", "to"):
            why = _fields_problem(ln.get(end), _END_FIELDS, f"links[{i}].{end}")
            if why:
                return why
    for i, u in enumerate(m.get("unmatched") or []):
        if not isinstance(u, dict):
            return f"unmatched[{i}] is {_kind(u)}, not a map"
    return None


def find_manifest(snapshot) -> Optional[Tuple[Dict[str, Any], int]]:
    """The group manifest beside `snapshot` that names it as a rank: (manifest, its rank);
    None when there is none (JSON files and extension-less files of the directory are read,
    as capture writes a job's manifest at OUT itself when the launcher made no CUDA call)."""
    target = os.path.realpath(os.fspath(snapshot))
    d = os.path.dirname(target)
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return None
    for name in names:
        p = os.path.join(d, name)
        if p == target or not os.path.isfile(p) or not is_manifest(p):
            continue
        try:
            m = load(p)
        except GroupError:
            continue
        for r in m["ranks"]:
            if os.path.realpath(r["snapshot"]) == target:
                m["path"] = p
                return m, r["rank"]
    return None


def run_info_group(path, as_json: bool = False) -> int:
    """`cudasnap info JOB.cusnap` for a manifest: ranks, GPUs, links; exit 2 when unreadable."""
    import sys
    try:
        m = load(path)
    except GroupError as e:
        sys.stderr.write(f"cudasnap: error: {e}\n")
        return 2
    if as_json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"group    : {path} ({len(m['ranks'])} processes)")
    if m.get("command"):
        print(f"command  : {' '.join(m['command'])}")
    for r in m["ranks"]:
        there = "" if os.path.isfile(r["snapshot"]) else "  (MISSING)"
        print(f"rank {r['rank']:<4}: pid {r['pid']}, GPU(s) {','.join(map(str, r.get('devices') or [])) or '-'}, "
              f"{r['snapshot']}{there}")
    kinds: Dict[str, int] = {}
    for ln in m.get("links", []):
        kinds[ln["kind"]] = kinds.get(ln["kind"], 0) + 1
    print("links    : " + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    for u in m.get("unmatched", []):
        print(f"unmatched: process {u.get('pid')} call #{u.get('seq')}: {u.get('why')}")
    return 0
