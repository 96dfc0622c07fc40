"""Isolated-mode run series for chosen launches, per way of running each repeat (diagnosis of
run-to-run spread; needs a GPU and cupti-python).

  python bench/diag/diag_isolated_series.py SNAPSHOT SEQ [SEQ...] [--repeat 40]

Variants (the product runs "default"):
  default    restore, L2 scrub, host sync, mark, launch, sync, mark
  nogap      restore, L2 scrub and launch queued together inside the window (no GPU idle
             between scrub and kernel); the scrub kernel's record is left out by name
  norestore  default without restoring memory (timing only)
Prints each variant's series and its max-min / median."""
from __future__ import annotations

import argparse
import statistics

from cudasnap.replay.profile import ProfileConfig, profile_replay
from cudasnap.replay.profile import isolated as iso
from cudasnap.replay.profile.graphunits import WindowClock

_orig = iso.IsolatedProfiler._windowed_runs


def _nogap(self, ev, saver, digests):
    rv, cfg, s = self.rv, self.cfg, ev.stream
    clock = WindowClock(self.cupti)
    clock.start()
    windows = []
    for i in range(cfg.warmup + cfg.repeat):
        rv.call("cuStreamSynchronize", s)
        m0 = clock.mark() if i >= cfg.warmup else None
        saver.restore(s)
        if self.flusher is not None:
            self.flusher.flush(s)
        ev.ctx.relaunch()
        rv.call("cuStreamSynchronize", s)
        if m0 is not None:
            windows.append((m0, clock.mark()))
    runs = clock.collect(windows)
    return [[k for k in run if k[2] != "cudasnap_l2_scrub"] for run in runs]


def _norestore(self, ev, saver, digests):
    real = saver.restore
    saver.restore = lambda s: None
    try:
        return _orig(self, ev, saver, digests)
    finally:
        saver.restore = real


VARIANTS = {"default": _orig, "nogap": _nogap, "norestore": _norestore}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("seqs", nargs="+", type=int)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--variants", default="default,nogap,norestore")
    a = ap.parse_args()
    for seq in a.seqs:
        for v in a.variants.split(","):
            iso.IsolatedProfiler._windowed_runs = VARIANTS[v]
            cfg = ProfileConfig(mode="isolated", repeat=a.repeat, warmup=3, launch=seq)
            run = profile_replay(a.snapshot, cfg)
            for r in run.report["launches"]:
                t = r.get("times_us") or []
                if not t:
                    print(f"#{seq} {v}: no times ({r.get('error')})")
                    continue
                med = statistics.median(t)
                print(f"#{seq} {v:9s} {r['name'][:50]} median {med:.2f} spread {(max(t) - min(t)) / med * 100:.2f}% "
                      f"noise {statistics.pstdev(t) / statistics.fmean(t) * 100:.2f}%")
                print("   " + " ".join(f"{x:.1f}" for x in t))


if __name__ == "__main__":
    main()
