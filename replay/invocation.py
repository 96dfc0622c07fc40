"""A replay to run, as one typed document instead of a rebuilt command line.

Campaign cells, bisect steps and their replay servers hand a replay over as the options the
command line would have built (ReplayOptions, ProfileConfig), never as argv parsed again:

    {"snapshot": PATH, "replay": {ReplayOptions fields}, "profile": {ProfileConfig fields} or null,
     "json": false}          (json: print the result as `--json` does)

`run(doc)` replays it in this process, as `cudasnap replay` does; `python -m
cudasnap.replay.invocation DOC` runs one in a fresh process (DOC: the document itself, a file
holding it, or `-` for stdin), for an environment that needs its own.

Every replay the command line, a campaign cell, a bisect step, a rank or the simulator's worker
runs goes through run_request(ReplayRequest): the snapshot, its options, the profile (None:
replay and verify), the target (driver None: the GPU through cuda-bindings; else another
Driver API, the simulator's)."""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .child import command  # noqa: F401  (where callers find it)
from .options import ReplayOptions


def profiled(snapshot: str, out: str, mode: str, kernels: Optional[str] = None, repeat: int = 10,
             warmup: int = 3, device: Optional[int] = None) -> Dict[str, Any]:
    """What `replay SNAP --profile MODE --out OUT -q --no-progress [--repeat R --warmup W]
    [--kernels K] [--device N]` runs with (repeats only where the mode repeats)."""
    from .profile import ProfileConfig
    from .profile.modes import mode as profile_mode
    cfg = ProfileConfig(mode=mode, kernels=kernels, out=out)
    if profile_mode(mode) is not None and profile_mode(mode).repeats:
        cfg.repeat, cfg.warmup = repeat, warmup
    opts = ReplayOptions(quiet=True, progress=False)
    if device is not None:
        opts.device = device
    return {"snapshot": snapshot, "replay": dataclasses.asdict(opts), "profile": dataclasses.asdict(cfg)}


def document(snapshot: str, replay: Optional[Dict[str, Any]] = None,
             profile: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A document from the fields that differ from the command line's defaults (quiet, no
    progress bar): replay= ReplayOptions fields, profile= ProfileConfig fields (None: no profile)."""
    opts = ReplayOptions(**dict({"quiet": True, "progress": False}, **(replay or {})))
    doc: Dict[str, Any] = {"snapshot": snapshot, "replay": dataclasses.asdict(opts), "profile": None}
    if profile is not None:
        from .profile import ProfileConfig
        doc["profile"] = dataclasses.asdict(ProfileConfig(**profile))
    return doc


# what command_line shows: (section, field, flag), in this order
_SHOWN = (("profile", "mode", "--profile"), ("profile", "calls", "--calls"), ("profile", "kernels", "--kernels"),
          ("profile", "repeat", "--repeat"), ("profile", "warmup", "--warmup"), ("replay", "device", "--device"),
          ("replay", "pace", "--pace"), ("replay", "launch_override", "--launch-override"),
          ("replay", "replace", "--replace"), ("profile", "timeline_check", "--timeline-check"),
          ("profile", "out", "--out"), ("profile", "trace", "--trace"))


def command_line(doc: Dict[str, Any]) -> List[str]:
    """The `cudasnap replay` command the document stands for, for people to read and rerun (the
    document, not this, is what runs): the options that differ from their defaults, the device,
    and the repeats of a mode that repeats."""
    from .profile import ProfileConfig
    from .profile.modes import names
    dflt = {"replay": dataclasses.asdict(ReplayOptions()), "profile": dataclasses.asdict(ProfileConfig())}
    out = ["cudasnap", "replay", doc["snapshot"]]
    prof = doc.get("profile") or {}
    for sec, field, flag in _SHOWN:
        part = doc.get(sec) or {}
        if field not in part:
            continue
        v = part[field]
        repeats = field in ("repeat", "warmup") and prof.get("mode") in names(repeats=True)
        if v == dflt[sec].get(field) and field != "device" and not repeats:
            continue
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, list):
            out += [x for item in v for x in (flag, str(item))]
        elif v is not None:
            out += [flag, str(v)]
    return out


def plain(snapshot: str, device: int = 0, watchdog: Optional[float] = None,
          tolerance: Optional[str] = None) -> Dict[str, Any]:
    """What `replay SNAP --device N [--watchdog S] [--tolerance T]` runs with: replay and verify,
    no profile."""
    return {"snapshot": snapshot, "replay": dataclasses.asdict(ReplayOptions(device=device, watchdog=watchdog,
                                                                            tolerance=tolerance)),
            "profile": None}


def typed(cls, d: Dict[str, Any]):
    """cls(**d), refusing a field cls does not have (a document from another version)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return cls(**d)


@dataclass
class ReplayRequest:
    snapshot: str
    options: ReplayOptions = dataclasses.field(default_factory=ReplayOptions)
    profile: Any = None         # a ProfileConfig (profile/__init__.py); None: replay and verify only
    driver: Any = None          # the target: None the GPU (cuda-bindings), else another Driver API
    json: bool = False          # the result as `--json` prints it, on stdout
    out: Any = None             # where the text goes (None: stdout)
    checked: bool = False       # the snapshot passed the preflight check in this process already


def run_request(req: ReplayRequest) -> int:
    """The one replay function: replays req in this process, prints as `cudasnap replay` does;
    the exit code (0 verified, 1 mismatch, 2 error)."""
    if req.profile is None:
        from . import run_replay_cli
        return run_replay_cli(req.snapshot, req.options, req.json, out=req.out, driver=req.driver)
    from .profile import run_profile_cli
    return run_profile_cli(req.snapshot, req.options, req.profile, req.json, out=req.out, checked=req.checked,
                           driver=req.driver)


def request(doc: Dict[str, Any], checked: bool = False) -> ReplayRequest:
    """The request a document stands for (its fields checked: ValueError names an unknown one)."""
    from .profile import ProfileConfig
    prof = doc.get("profile")
    return ReplayRequest(doc["snapshot"], typed(ReplayOptions, doc["replay"]),
                         typed(ProfileConfig, prof) if prof is not None else None,
                         json=bool(doc.get("json")), checked=checked)


def run(doc: Dict[str, Any], checked: bool = False) -> int:
    """Replays doc in this process; its exit code (0 verified, 1 mismatch, 2 error). checked:
    the snapshot has passed the preflight check in this process already."""
    return run_request(request(doc, checked))


def main(argv: List[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m cudasnap.replay.invocation DOC|DOC.json|-\n")
        return 2
    a = argv[0]
    try:
        if a.lstrip().startswith("{"):
            doc = json.loads(a)
        elif a == "-":
            doc = json.load(sys.stdin)
        else:
            with open(a) as f:
                doc = json.load(f)
        return run(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write(f"cudasnap: error: replay document {a[:60]}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
