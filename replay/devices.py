"""Which GPU each recorded device replays on, for a snapshot of one process that drove
several GPUs.

Recorded device ordinals come from the contexts the snapshot identified (primary contexts
retained, contexts created). The map: --devices A,B,... (recorded device i -> GPU A, B...);
else, when the snapshot used several devices, this machine has that many and --device was
left at 0, each recorded device on the GPU of the same ordinal; else all of them fold onto
--device (said in a note). With several live GPUs, memory is created on the GPU of the
context current at the time and made accessible from every other GPU of the replay that can
reach it, as capture's placement does."""
from __future__ import annotations

from typing import Dict, List, Optional


class DeviceMapError(ValueError):
    pass


def recorded_devices(ctx) -> List[int]:
    devs = sorted({d.get("device") for d in ctx.ctx_ids.values() if isinstance(d.get("device"), int)})
    return devs or [0]


def parse(spec: str) -> List[int]:
    try:
        out = [int(x) for x in spec.split(",") if x.strip() != ""]
    except ValueError:
        out = []
    if not out or any(d < 0 for d in out):
        raise DeviceMapError(f"--devices {spec}: give GPU ordinals separated by commas (e.g. 0,1)")
    return out


def build(recorded: List[int], spec: Optional[str], device: int, count: int) -> Dict[int, int]:
    """recorded ordinal -> live ordinal (raises DeviceMapError)."""
    if spec:
        ds = parse(spec)
        if len(ds) <= max(recorded):
            raise DeviceMapError(f"--devices {spec}: the snapshot used device {max(recorded)}; give one GPU for each "
                                 f"of devices 0..{max(recorded)}")
        bad = [d for d in ds if d >= count]
        if bad:
            raise DeviceMapError(f"--devices {spec}: GPU {bad[0]} is not present ({count} GPU(s))")
        return {r: ds[r] for r in recorded}
    if len(recorded) > 1 and device == 0 and max(recorded) < count:
        return {r: r for r in recorded}
    return {r: device for r in recorded}


def live_device(ctx, rec_dev) -> object:
    """The live CUdevice for a recorded device ordinal (the replay's device when unknown)."""
    m = ctx.devmap
    if m is None:
        m = _init(ctx)
    live = m.get(rec_dev) if isinstance(rec_dev, int) else None
    if live is None:
        return ctx.dev
    cache = ctx.devlive
    if live not in cache:
        cache[live] = ctx.raw("cuDeviceGet", live)
    return cache[live]


def _init(ctx) -> Dict[int, int]:
    rec = recorded_devices(ctx)
    try:
        count = int(ctx.raw("cuDeviceGetCount"))
    except Exception:
        count = 1
    try:
        m = build(rec, getattr(ctx.opt, "devices", None), ctx.opt.device, count)
    except DeviceMapError as e:
        from .errors import ReplayError
        raise ReplayError(str(e))
    ctx.devmap, ctx.devlive = m, {ctx.opt.device: ctx.dev}
    live = sorted(set(m.values()))
    if len(rec) > 1:
        if len(live) == 1:
            ctx.note(f"the snapshot used {len(rec)} GPUs; they replay on GPU {live[0]} alone "
                    f"(give --devices, or a machine with {max(rec) + 1} GPUs)")
        else:
            ctx.note("devices: " + ", ".join(f"recorded {r} on GPU {m[r]}" for r in rec))
    if len(live) > 1 and ctx.ops is not None:
        ctx.ops.follow_context(live)
    return m
