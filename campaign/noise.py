"""The noise a campaign measures itself, beside each cell's own spread.

A verdict's bar is max(threshold, noise_sigmas x this noise). It is the spread of null ratios:
ratios of two measurements that should be equal, gathered over every GPU and run of the
campaign for the same snapshot and kernel:

- run to run on one GPU: in each paired task (A B A B), each baseline replay against the one
  before it, and each candidate replay against the one before it (A2/A1, B2/B1);
- controls: a control env's replays against its baseline's, paired on one GPU; a control cell
  is judged without its own env's ratios.

The spread of each kind is 1.4826 x the median |log ratio| (a robust standard deviation
around 1), in percent; the wider of the two is the noise. The baseline's offset between GPUs (its medians on different GPUs, unpaired) is
measured too and shown: the pairing cancels it, so it is not part of the bar."""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Tuple

from .rules import replay_medians

RUN, CONTROL = "run", "control"


class NoiseModel:
    def __init__(self) -> None:
        # (snapshot, kernel) -> [(kind, env, gpu, log ratio)]
        self.null: Dict[Tuple[str, str], List[Tuple[str, str, str, float]]] = {}
        # (snapshot, kernel) -> gpu -> baseline medians there
        self.base: Dict[Tuple[str, str], Dict[str, List[float]]] = {}

    def _add(self, snap: str, kernel: str, kind: str, env: str, gpu: str, a: float, b: float) -> None:
        if a > 0 and b > 0:
            self.null.setdefault((snap, kernel), []).append((kind, env, gpu, math.log(b / a)))

    def add_baseline(self, snap: str, gpu: str, profile: Dict[str, Any]) -> None:
        for k, m in replay_medians(profile).items():
            self.base.setdefault((snap, k), {}).setdefault(gpu, []).append(m)

    def add_task(self, snap: str, env: str, control: bool, gpu: str, base: List[Dict[str, Any]],
                 cand: List[Dict[str, Any]]) -> None:
        """A paired task's replays (baseline and candidate, in their order) on GPU gpu."""
        mb = [replay_medians(p) for p in base]
        mc = [replay_medians(p) for p in cand]
        for side in (mb, mc):
            for prev, cur in zip(side, side[1:]):
                for k in prev.keys() & cur.keys():
                    self._add(snap, k, RUN, env, gpu, prev[k], cur[k])
        for m in mb:
            for k, v in m.items():
                self.base.setdefault((snap, k), {}).setdefault(gpu, []).append(v)
        if control:
            for a, b in zip(mb, mc):
                for k in a.keys() & b.keys():
                    self._add(snap, k, CONTROL, env, gpu, a[k], b[k])

    def add_group(self, snap: str, gpu: str, base: List[Dict[str, Any]],
                  cands: List[Tuple[str, bool, List[Dict[str, Any]]]]) -> None:
        """A shared-baseline task: its baseline replays counted once, each candidate's
        (env, control, replays) beside the baseline replays of its own rounds."""
        mb = [replay_medians(p) for p in base]
        self.add_task(snap, "", False, gpu, base, [])
        for env, control, profs in cands:
            mc = [replay_medians(p) for p in profs]
            for prev, cur in zip(mc, mc[1:]):
                for k in prev.keys() & cur.keys():
                    self._add(snap, k, RUN, env, gpu, prev[k], cur[k])
            if control:
                for a, b in zip(mb, mc):
                    for k in a.keys() & b.keys():
                        self._add(snap, k, CONTROL, env, gpu, a[k], b[k])

    def noise(self, snap: str, kernel: str, exclude_env: Optional[str] = None) -> Optional[float]:
        """The spread of the null ratios of this snapshot's kernel, in percent (None: none yet);
        exclude_env: a control judged without its own ratios against the baseline."""
        out = None
        for want in (RUN, CONTROL):       # each kind its own spread: the wider counts
            xs = [abs(x) for kind, env, _, x in self.null.get((snap, kernel), [])
                  if kind == want and not (kind == CONTROL and env == exclude_env)]
            if xs:
                v = 1.4826 * statistics.median(xs) * 100
                out = v if out is None else max(out, v)
        return out

    def sources(self, snap: str, kernel: str, exclude_env: Optional[str] = None) -> Dict[str, int]:
        """How many null ratios of each kind, and on how many GPUs, the noise stands on."""
        rows = [r for r in self.null.get((snap, kernel), []) if not (r[0] == CONTROL and r[1] == exclude_env)]
        return {"run": sum(r[0] == RUN for r in rows), "control": sum(r[0] == CONTROL for r in rows),
                "gpus": len({r[2] for r in rows})}

    def gpu_offset(self, snap: str, kernel: str) -> Optional[float]:
        """The baseline's spread between GPUs (max - min of its per-GPU medians over their
        median, percent), None with fewer than two GPUs."""
        per = [statistics.median(v) for v in self.base.get((snap, kernel), {}).values() if v]
        if len(per) < 2:
            return None
        m = statistics.median(per)
        return (max(per) - min(per)) / m * 100 if m > 0 else None
