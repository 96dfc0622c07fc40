"""The flight recorder: `cudasnap capture --flight-recorder[=SECONDS]`.

Every SECONDS the recorder asks the shim for a checkpoint (the state, as at a window start:
shim_window.c); each checkpoint starts a segment holding the state and every call after it.
At most two segments exist (the previous checkpoint's and the current one's), so disk use
stays bounded. A snapshot is written only on a trigger: a driver call that returns an error
(`--trigger sticky`, the default: errors that poison the context; `any`: every error but
CUDA_ERROR_NOT_READY and failed queries), the program dying of a signal (the ring in shared
memory outlives it, SIGKILL included), a synchronization making no progress for
`--hang-timeout` seconds, or SIGUSR2 sent to cudasnap. The older segment (at least SECONDS
of calls) becomes the snapshot; the other is removed. A clean exit writes nothing."""
from __future__ import annotations

import os
import re
import signal as _signal
import struct
import time
from pathlib import Path
from typing import List, Optional

from cudasnap.formats.cuerrors import cu_result_name

from .window import Segment, WindowRouter, copied_note

# errors after which the context is unusable (the CUDA documentation calls them sticky)
STICKY = {214, 700, 702, 710, 714, 715, 716, 717, 718, 719, 720}
DEATH_SIGNALS = {int(_signal.SIGSEGV), int(_signal.SIGABRT), int(_signal.SIGBUS), int(_signal.SIGKILL),
                 int(_signal.SIGILL), int(_signal.SIGFPE), int(_signal.SIGTERM)}
_QUERYISH = re.compile(r"Get|Query|Is[A-Z]|Occupancy")
_SYNC = re.compile(r"Synchronize|cuStreamWaitValue")
POST_TRIGGER_S = 2.0        # calls after an error trigger still recorded (the program's reaction)


class FlightRouter(WindowRouter):
    def __init__(self, *a, period_s: float = 60.0, trigger: str = "sticky", hang_timeout: Optional[float] = None,
                 **kw):
        super().__init__(*a, **kw)
        self.period_s = period_s
        self.trigger_mode = trigger
        self.hang_timeout = hang_timeout
        self.last_request = time.monotonic()
        self.triggered: Optional[str] = None
        self.sticky = False                      # the trigger was an error that poisons the context
        self.trigger_t = 0.0
        self.trigger_seq: Optional[int] = None
        self.trigger_head: Optional[int] = None
        self.urgent = bool(hang_timeout)         # watching for hangs: the ring is read as it fills
        self.done = False
        self.checkpoints = 0
        self.discarded: List[str] = []
        self.written: Optional[Path] = None
        self._hung: List[dict] = []
        self.pauses: List[float] = []
        self.dumps: List[dict] = []              # the shim's account of each checkpoint's state
        self._open_segment(0, "start", self._tmp_path(0))

    def _tmp_path(self, n: int) -> Path:
        stem = self.base.name[: -len(".cusnap")] if self.base.name.endswith(".cusnap") else self.base.name
        return self.base.with_name(f"{stem}.flight{n}.partial.cusnap")

    # checkpoints -----------------------------------------------------------
    def _start(self, rec: dict) -> None:
        if self.done:
            return
        self.checkpoints += 1
        seg = self._open_segment(self.serial, "checkpoint", self._tmp_path(self.serial), rec.get("launches"))
        seg.writer.write(rec)
        self._ckpt_t = rec.get("t")
        while len(self.active) > 2:              # at most two checkpoints on disk
            self._discard(self.active.pop(0))

    def _on_window(self, rec: dict) -> None:
        if rec.get("op") == "state" and getattr(self, "_ckpt_t", None) and rec.get("t"):
            # the program's pause: the shim's count (the state may drain after it), else the
            # time from the checkpoint's record to the state's end
            self.pauses.append(rec["pause_ns"] / 1e9 if "pause_ns" in rec else (rec["t"] - self._ckpt_t) / 1e9)
            self.dumps.append({k: rec.get(k, 0) for k in ("bytes", "copied", "referenced", "hashed", "hash_ns",
                                                          "dump_ns", "pause_ns", "wait_ns", "spare")})
        super()._on_window(rec)

    def _discard(self, seg: Segment) -> None:
        try:
            seg.writer.close()
        except OSError:
            pass
        try:
            os.unlink(seg.path)
        except OSError:
            pass

    # triggers --------------------------------------------------------------
    def _after_call(self, rec: dict) -> None:
        r = rec.get("r")
        if not r or self.triggered or self.done:
            return
        f = rec.get("f") or ""
        if self.trigger_mode == "sticky" and r not in STICKY:
            return
        if self.trigger_mode == "any" and (r == 600 or _QUERYISH.search(f)):
            return
        self.sticky = r in STICKY
        self.trigger(f"call #{rec.get('s')} {f} returned {cu_result_name(r)}", rec.get("s"))

    def trigger(self, why: str, seq: Optional[int] = None, now: bool = False) -> None:
        with self.lock:
            if self.triggered or self.done:
                return
            self.triggered, self.trigger_seq = why, seq
            self.urgent = True               # the recorder drains at once (no lazy wait)
            self.trigger_t = time.monotonic()
            if now and self.ring is not None:
                # written once everything the program did up to now is read from the ring
                self.trigger_head = self.ring.head()
                self.trigger_t -= POST_TRIGGER_S

    def tick(self) -> None:
        # never wait for the drain thread (it may be copying chunks): the watcher beats the rings
        now = time.monotonic()
        if self.in_state:                        # the last checkpoint's state is still coming:
            self.last_request = now              # the period runs from its end
        if self.ring is not None and not self.triggered and not self.done and now - self.last_request >= self.period_s:
            self.last_request = now
            try:
                self.ring.request_window()
            except (ValueError, BufferError):     # the ring was closed meanwhile (the end)
                pass
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self.done:
                return
            if self.triggered:
                if now - self.trigger_t >= POST_TRIGGER_S and self.trigger_head is None:
                    self._finalize(None)
                return
            if self.hang_timeout and self.decoder is not None:
                self._check_hang()
        finally:
            self.lock.release()

    def _check_hang(self) -> None:
        try:
            open_calls = list(self.decoder.open.values())
        except RuntimeError:                     # changed meanwhile: next tick
            return
        now_ns = time.monotonic_ns()
        for c in open_calls:
            if _SYNC.search(c.get("f") or "") and c.get("t0") and now_ns - c["t0"] > self.hang_timeout * 1e9:
                self._hung = [dict(c, incomplete=True) for c in open_calls]
                self.triggered = f"hang: call #{c.get('s')} {c.get('f')} made no progress for {self.hang_timeout:g} s"
                self._finalize(None)
                return
        stuck = self._launch_in_flight()
        if stuck is not None and now_ns - stuck["t0"] > self.hang_timeout * 1e9:
            self._hung = [dict(c, incomplete=True) for c in open_calls] + [stuck]
            self.triggered = (f"hang: call #{stuck['s']} {stuck['f']} did not return for {self.hang_timeout:g} s "
                              f"(the recorder read everything before it)")
            self._finalize(None)

    def _launch_in_flight(self) -> Optional[dict]:
        """The launch the ring's reader waits on (published 'in flight', its call not returned):
        an incomplete call record naming it (its arguments stay in the ring)."""
        from . import ring as R
        ring = self.ring
        if ring is None:
            return None
        try:
            tail = ring.tail
            if ring.head() <= tail:
                return None
            off = R.HDR_SIZE + (tail & ring.mask)
            (ln, state, _typ, _nf, fn, seq, tid, t, _res, _aux) = R.REC_HDR.unpack_from(ring.mm, off)
        except (ValueError, struct.error):
            return None
        if state != R.state_word(tail, R.INFLIGHT) or ln < R.REC_HDR.size:
            return None
        fns = self.decoder.fns if self.decoder is not None else []
        name = fns[fn]["name"] if 0 <= fn < len(fns) else f"API {fn}"
        return {"k": "c", "s": seq, "tid": tid, "t0": ring.to_ns(t), "f": name, "a": {}, "incomplete": True}

    # the end ---------------------------------------------------------------
    def write(self, rec: dict) -> None:
        with self.lock:
            if self.done:
                return
            super().write(rec)
            if self.triggered and self.trigger_head is None and time.monotonic() - self.trigger_t >= POST_TRIGGER_S:
                self._finalize(None)

    def after_feed(self) -> None:
        """The drain thread fed every record it read: a trigger asked for 'now' is written once
        the ring was read past the point it came at."""
        with self.lock:
            h = self.trigger_head
            if self.triggered and not self.done and h is not None and self.ring is not None and self.ring.tail >= h:
                self._finalize(None)

    def _on_end(self, rec: dict) -> None:
        sig = rec.get("signal")
        if not self.triggered:
            if sig:
                self.triggered = f"the program died of signal {sig} ({_signame(sig)})"
            elif rec.get("clean_exit") is False:
                # _exit(), or a death the status does not show: the program's teardown never ran
                code = rec.get("exit")
                self.triggered = "the process ended without running its exit handlers" + (
                    f" (exit status {code})" if code is not None else "")
        if self.triggered:
            self._finalize(rec)
        else:
            for seg in self.active:
                self._discard(seg)
            self.active = []
            self.done = True

    def _finalize(self, end: Optional[dict]) -> None:
        if self.done or not self.active:
            self.done = True
            return
        keep, rest = self.active[0], self.active[1:]
        for seg in rest:
            self._discard(seg)
        self.active = []
        for c in self._hung:
            keep.writer.write(c)
        e = dict(end) if end else {"k": "end", "exit": None, "signal": None, "partial": False}
        e["trigger"] = {"why": self.triggered, "seq": self.trigger_seq, "checkpoint": keep.n}
        keep.writer.write({"k": "note", "level": "info", "msg": f"flight recorder: written on {self.triggered}"})
        # no end state to verify (formats/SCHEMA.md, "endstate"): replay says why
        keep.writer.write({"k": "endstate", "none": (
            f"the trigger ({self.triggered}) left the device in a sticky error state: its memory is not trustworthy"
            if self.sticky else f"the flight recorder does not read device memory at a trigger ({self.triggered})")})
        self._close_segment(keep, None, e)
        try:
            os.replace(keep.path, self.base)
            self.outputs[-1] = self.base
            self.windows[-1]["path"] = str(self.base)
            self.written = self.base
        except OSError:
            self.written = keep.path
        self.done = True

    def close(self) -> None:
        with self.lock:
            if not self.done:
                if self.triggered:
                    self._finalize(None)
                else:
                    for seg in self.active:
                        self._discard(seg)
                    self.active = []
                    self.done = True

    def summary(self) -> List[str]:
        return self._summary() + [_dump_line(i + 1, d) for i, d in enumerate(self.dumps)]

    def _summary(self) -> List[str]:
        p = ""
        if self.pauses:
            ps = sorted(self.pauses)
            p = f"; checkpoint pauses p50 {ps[len(ps) // 2] * 1e3:.1f} ms, max {ps[-1] * 1e3:.1f} ms"
        if self.written is None:
            return [f"flight recorder: no trigger, nothing written ({self.checkpoints} checkpoints{p})"]
        w = self.windows[-1]
        return [f"flight recorder: {self.triggered}: wrote {self.written} ({w['calls']:,} calls since checkpoint "
                f"{w['n']}, state {w['state_bytes']:,} bytes{copied_note(w)}; {self.checkpoints} checkpoints{p})"]


def _dump_line(n: int, d: dict) -> str:
    """One checkpoint: its size, the program's pause and its speed, the drain, how much
    crossed the bus, the hashing's speed."""
    gib = 1 << 30
    secs = d.get("dump_ns", 0) / 1e9
    pause = d.get("pause_ns", 0) / 1e9 or secs
    line = (f"checkpoint {n}: state {d['bytes'] / gib:.2f} GiB, program paused {pause * 1e3:.1f} ms "
            f"({d['bytes'] / pause / 1e9 if pause else 0:.1f} GB/s), complete after {secs * 1e3:.1f} ms, "
            f"copied {d['copied'] / gib:.2f} GiB, unchanged {d['referenced'] / gib:.2f} GiB")
    if d.get("spare"):
        line += f", spare device memory {d['spare'] / gib:.2f} GiB"
    if d.get("wait_ns", 0) >= 1e6:
        line += f", waited {d['wait_ns'] / 1e6:.1f} ms for the previous checkpoint's drain"
    if d.get("hashed") and d.get("hash_ns"):
        line += f", GPU hashing {d['hashed'] / gib:.2f} GiB at {d['hashed'] / d['hash_ns']:.1f} GB/s"
    return line


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
