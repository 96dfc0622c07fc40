"""The recorder: drains every ring of a capture session into one snapshot per process.

It runs inside `cudasnap capture`, beside the program. Rings appear in the session
directory as processes make their first driver call; each gets a drain thread, a decoder
and a SnapshotWriter (compression runs on the writer's thread pool)."""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cudasnap.formats.console import __version__
from cudasnap.formats import SnapshotWriter
from cudasnap.formats.vocab import in_class
from cudasnap.shim import description

from .decode import Decoder
from .jitptx import ImageTap, PtxFinder, XlaDump, program_env, xla_flags_dump_dir
from .ring import Ring

LAZY_MAX_AGE_S = 5.0     # lazy draining: records wait in the ring at most this long
LINGER_S = 5.0           # a process still running this long after its exit handlers and the
                         # program's end, with nothing new in its ring, is left behind

ENV_KEEP = ("CUDA_", "PYTORCH_", "XLA_", "JAX_", "TRITON_", "NCCL_", "LD_LIBRARY_PATH", "CUDASNAP_",
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_")   # ranks of a job


def default_threads() -> int:
    """Writer threads per captured process: half the cores, at most 8. The program's own copy
    helpers take the other half while it uploads; on the 16-core H200 host 8 writers
    captured unique uploads at 10.7-11.3 GB/s where 16 gave 7.3-9.0 and 12 gave 9.0-9.5."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class _NullWriter:
    """Stands in for a SnapshotWriter that could not be created: accepts and drops."""

    stats: dict = {}

    def write(self, *args, **kw) -> None:
        pass

    def put_chunk(self, digest, data, release=None) -> str:
        if release is not None:    # a pinned ring piece: hand the space back
            release()
        return ""

    def add_blob_chunks(self, *args, **kw) -> str:
        return ""

    def flush(self, *args, **kw) -> None:
        pass

    def close(self, *args, **kw) -> None:
        pass


@dataclass
class ProcessCapture:
    ring: Ring
    path: Path
    writer: SnapshotWriter
    decoder: Decoder
    thread: threading.Thread | None = None
    partial: bool = False
    disk_error: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    undecodable: int = 0         # ring records the decoder failed on
    left_running: bool = False   # drained until LINGER_S after exit, the process still running
    failure: str | None = None   # the drain stopped on an error of the recorder's own
    loss: dict = field(default_factory=dict)   # the end record's account of what is missing
    ptx: PtxFinder | None = None  # JIT caches holding the PTX of loaded cubins
    ptx_kept: dict = field(default_factory=dict)   # where kept PTX came from -> modules
    xla: XlaDump | None = None    # --keep-ptx xla: the program's XLA dump directory
    tap: ImageTap | None = None   # --keep-ptx: loaded cubins' bytes, for their kernels' names
    cubins: int = 0               # --keep-ptx: modules loaded from a cubin (no PTX in the image)
    cubins_kept: int = 0          # of those, modules whose PTX was kept


def _proc_info(pid: int) -> dict:
    info: dict = {"pid": pid}
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        info["argv"] = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    except OSError:
        info["argv"] = []
    try:
        env = {}
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            k, _, v = item.decode("utf-8", "replace").partition("=")
            if k.startswith(ENV_KEEP):
                env[k] = v
        info["env"] = env
    except OSError:
        info["env"] = {}
    try:
        info["cwd"] = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        info["cwd"] = None
    return info


class Recorder:
    def __init__(self, session_dir: Path, out: Path, root_pid_getter, options: dict, level: int = 3,
                 threads: int | None = None, blob_level: int | None = None, drain: str = "lazy",
                 segments: int = 8, force: bool = False):
        """threads: writer worker threads per process (encode + write frames); None means
        default_threads(). level: zstd level of record frames. blob_level: zstd level
        of blob chunks, default 1 (on weight-like data (bf16/f32/int arrays) level 1 gives
        the ratio of level 3 at about twice the speed); chunks whose sample does not
        compress by 3% are stored raw at any level. segments: side files large chunks
        spill into while the snapshot file is busy (SnapshotWriter), folded in at the end."""
        self.session_dir = session_dir
        self.out = out
        self.root_pid_getter = root_pid_getter
        self.options = options
        self.level = level
        self.threads = default_threads() if threads is None else threads
        self.blob_level = 1 if blob_level is None else blob_level
        self.drain = drain
        self.segments = segments
        self.force = force
        self.procs: dict[int, ProcessCapture] = {}
        self.unreadable: set[int] = set()
        self.desc = description.load()
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="cudasnap-watch", daemon=True)
        self.lock = threading.Lock()
        self._root_exit = (None, None)
        self.root_exited = threading.Event()

    def start(self) -> None:
        self.watcher.start()

    def _path_for(self, pid: int, ppid: int = -1) -> Path:
        root = self.root_pid_getter()
        # the program is the only process started by this one: its ring may appear before
        # its pid is known here
        if pid == root or (root < 0 and ppid == os.getpid()):
            return self.out
        stem = self.out.name[: -len(".cusnap")] if self.out.name.endswith(".cusnap") else self.out.name
        return self.out.with_name(f"{stem}.{pid}.cusnap")

    def _stem(self) -> str:
        return self.out.name[: -len(".cusnap")] if self.out.name.endswith(".cusnap") else self.out.name

    def _claim(self, path: Path):
        """How a snapshot file is opened: made exclusively where nothing was to be replaced,
        replaced under a lock where -f allowed it; a FIFO or device as it is."""
        if os.path.lexists(path) and not path.is_file():
            return None
        return "replace" if self.force or path != self.out else "new"

    def _scan(self) -> None:
        try:
            names = os.listdir(self.session_dir)
        except OSError:
            return
        for name in names:
            if not (name.startswith("ring-") and name.endswith(".shm")):
                continue
            try:
                pid = int(name[5:-4])
            except ValueError:
                continue
            with self.lock:
                if pid in self.procs or pid in self.unreadable:
                    continue
                try:
                    self._open(pid, self.session_dir / name)
                except (OSError, ValueError) as e:
                    self.unreadable.add(pid)
                    print(f"cudasnap: error: process {pid} is not recorded: {e}", file=sys.stderr)

    def _open(self, pid: int, ring_path: Path) -> None:
        ring = Ring(str(ring_path))
        ring.beat()
        info = _proc_info(pid)
        header = {
            "format": "cudasnap",
            "created": time.time(),
            "started": ring.started,
            "host": socket.gethostname(),
            "pid": pid,
            "ppid": ring.ppid,
            "argv": info["argv"],
            "cwd": info["cwd"],
            "env": info["env"],
            "options": self.options,
            "api": {"source": self.desc.doc.get("source"), "digest": self.desc.digest},
            "tool_version": __version__,
        }
        mismatch = ring.fn_count != len(self.desc.functions) or (
            ring.api_digest and self.desc.digest and not self.desc.digest.startswith(ring.api_digest))
        if mismatch:
            # the ids in the ring would decode to the wrong functions: say so loudly
            header["api"]["shim_digest"] = ring.api_digest
            print(f"cudasnap: error: the shim library was built from another API description "
                  f"({ring.fn_count} functions, digest {ring.api_digest[:12]}) than this cudasnap has "
                  f"({len(self.desc.functions)}, {self.desc.digest[:12]}): reinstall cudasnap (pip install .)",
                  file=sys.stderr)
        path = self._path_for(pid, ring.ppid)
        error = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.options.get("window"):      # windows / flight recorder: one file per window
                writer = self._router(path, header)
            else:
                try:
                    writer = SnapshotWriter(path, header, level=self.level, threads=self.threads,
                                            blob_level=self.blob_level, segments=self.segments,
                                            claim=self._claim(path))
                except FileExistsError:
                    # another capture took this -o meanwhile: this one gets its own name, never its file
                    taken, path = path, self.out.with_name(f"{self._stem()}.{pid}.cusnap")
                    print(f"cudasnap: warning: {taken} was taken by another writer meanwhile; this process's "
                          f"snapshot is {path}", file=sys.stderr)
                    writer = SnapshotWriter(path, header, level=self.level, threads=self.threads,
                                            blob_level=self.blob_level, segments=self.segments, claim="new")
        except OSError as e:
            # full disk, read-only directory...: keep draining so the program never stalls
            error = str(e)
            print(f"cudasnap: warning: cannot write {path} ({e}); this process is not recorded", file=sys.stderr)
            writer = _NullWriter()
        pc = ProcessCapture(ring, path, writer, Decoder(self.desc, writer, clock=ring.to_ns))
        if hasattr(writer, "tick"):
            writer.ring, writer.decoder = ring, pc.decoder
        if error:
            pc.disk_error, pc.partial = error, True
        if isinstance(writer, SnapshotWriter):     # windows keep what their state needs only
            # a process already gone shows no environment: the capture's own is the program's
            penv = program_env(pid)
            pc.ptx = PtxFinder({**os.environ, **penv})
            keep = self.options.get("keep_ptx") or {}
            if "xla" in keep:     # the process's own XLA_FLAGS: a child may dump elsewhere
                where = xla_flags_dump_dir(penv.get("XLA_FLAGS") or "") or keep["xla"]
                pc.xla = XlaDump(where) if where else None
            if keep:
                pc.tap = pc.decoder.blob_sink = ImageTap(writer)
        pc.thread = threading.Thread(target=self._drain, args=(pc,), name=f"cudasnap-drain-{pid}", daemon=True)
        self.procs[pid] = pc
        pc.thread.start()

    def _router(self, path: Path, header: dict):
        from .window import TimeWindows, WindowRouter
        from .flight import FlightRouter

        win = self.options["window"]

        def make_writer(p: Path, hdr: dict) -> SnapshotWriter:
            # no side files: a later window reads chunks back from this file (WindowRouter._fetch)
            return SnapshotWriter(p, hdr, level=self.level, threads=self.threads, blob_level=self.blob_level,
                                  segments=0)

        base = dict(window=win)
        if win["mode"] == "flight":
            return FlightRouter(path, header, self.desc, make_writer, period_s=win["period"],
                                trigger=win.get("trigger", "sticky"), hang_timeout=win.get("hang_timeout"), **base)
        if win["mode"] == "time":
            return TimeWindows(path, header, self.desc, make_writer, start_s=win["start"], end_s=win["end"], **base)
        return WindowRouter(path, header, self.desc, make_writer, **base)

    def routers(self) -> list:
        with self.lock:
            return [pc.writer for pc in self.procs.values() if hasattr(pc.writer, "tick") and not pc.done.is_set()]

    def request_window(self) -> None:
        """SIGUSR1 in `--window signal`: open or close the window in every process."""
        for r in self.routers():
            if r.ring is not None and r.window.get("mode") == "signal":
                try:
                    r.ring.request_window()
                except (ValueError, BufferError):
                    pass

    def trigger(self, why: str) -> None:
        """SIGUSR2 with `--flight-recorder`: write the snapshot now."""
        for r in self.routers():
            if hasattr(r, "trigger"):
                r.trigger(why, now=True)

    def _tick(self) -> None:
        for r in self.routers():
            try:
                r.tick()
            except Exception as e:  # never let a window problem stop the watcher
                print(f"cudasnap: warning: window: {type(e).__name__}: {e}", file=sys.stderr)

    def _watch(self) -> None:
        while not self.stop.is_set():
            self._scan()
            self._beat()
            self._tick()
            self.stop.wait(0.02)
        self._scan()

    def _beat(self) -> None:
        """Tell the shims the recorder is alive while their drain threads run, even while one
        waits for the disk: a program whose ring is full then waits instead of dropping."""
        with self.lock:
            pcs = list(self.procs.values())
        for pc in pcs:
            if pc.done.is_set() or pc.thread is None or not pc.thread.is_alive():
                continue
            try:
                pc.ring.beat()
            except (ValueError, BufferError):       # closed meanwhile
                pass

    def _write(self, pc: ProcessCapture, recs: list) -> None:
        if pc.disk_error:
            return
        try:
            for r in recs:
                pc.writer.write(r)
        except OSError as e:  # full disk & co: warn once, keep the program running
            pc.disk_error = str(e)
            pc.partial = True
            print(f"cudasnap: warning: writing {pc.path} failed ({e}); the snapshot is partial", file=sys.stderr)

    def _feed(self, pc: ProcessCapture, raws: list) -> None:
        """Decode ring records and write what they complete."""
        for raw in raws:
            try:
                recs = pc.decoder.feed(raw)
            except OSError as e:
                recs = []
                if not pc.disk_error:
                    pc.disk_error = str(e)
                    pc.partial = True
                    print(f"cudasnap: warning: writing {pc.path} failed ({e}); the snapshot is partial", file=sys.stderr)
            except Exception as e:  # a record that does not decode: counted, never fatal
                recs = []
                if raw.release is not None:
                    raw.release()
                pc.undecodable += 1
                if pc.undecodable == 1:
                    print(f"cudasnap: warning: process {pc.ring.pid}: a ring record of type {raw.type} "
                          f"could not be decoded ({type(e).__name__}: {e}); the snapshot is partial", file=sys.stderr)
            if recs:
                self._write(pc, recs)
                if pc.ptx is not None:
                    self._write(pc, self._kept_ptx(pc, recs))

    def _kept_ptx(self, pc: ProcessCapture, recs: list) -> list:
        """A ptx record (formats/jitptx.py) for each module loaded from an image whose PTX a JIT
        cache holds beside it (module loads are rare: the cache is searched in the drain)."""
        out = []
        wall = time.time_ns() - time.monotonic_ns()          # record times are CLOCK_MONOTONIC
        for r in recs:
            ref = (r.get("x") or {}).get("image")
            if r.get("k") != "c" or r.get("r") != 0 or not isinstance(ref, dict) or not ref.get("blob") \
                    or not in_class(r.get("f") or "", "loads_code"):
                continue
            try:
                image = pc.tap.take(ref["blob"]) if pc.tap is not None else None
                cubin = pc.tap is not None and ref["blob"] in pc.tap.cubins
                pc.cubins += cubin
                hit = pc.ptx.find(ref["blob"], int(ref.get("size") or 0))
                if hit is None and pc.xla is not None and cubin:
                    hit = pc.xla.find(ref["blob"], image, int(r.get("t0") or 0) + wall)
                if hit is not None:
                    ptx, what, path = hit
                    out.append({"k": "ptx", "image": ref["blob"], "from": what, "path": path,
                                "x": {"ptx": {"blob": pc.writer.add_blob(ptx), "size": len(ptx)}}})
                    pc.ptx_kept[what] = pc.ptx_kept.get(what, 0) + 1
                    pc.cubins_kept += cubin
            except Exception as e:     # never let the search cost the capture
                print(f"cudasnap: warning: looking for the PTX of call #{r.get('s')}: {type(e).__name__}: {e}",
                      file=sys.stderr)
        return out

    def _drain(self, pc: ProcessCapture) -> None:
        try:
            self._drain_ring(pc)
        except Exception as e:  # never leave without an end record saying so
            import traceback

            pc.failure = f"{type(e).__name__}: {e}"
            print(f"cudasnap: error: draining process {pc.ring.pid} failed; the snapshot is partial\n"
                  + traceback.format_exc(), file=sys.stderr)
        self._finish(pc)

    def _drain_ring(self, pc: ProcessCapture) -> None:
        ring = pc.ring
        last_flush = time.monotonic()
        idle_since = None
        lazy = self.drain == "lazy"
        low = ring.capacity // 4
        last_drain = time.monotonic()
        burst = False
        while True:
            ring.beat()
            if lazy and not burst:
                # leave records in the ring while it has room: the program runs without the
                # recorder's work beside it (the ring survives the program whatever happens);
                # during a burst of payload data (a pass read a sixteenth of the ring) drain on
                now = time.monotonic()
                if (ring.head() - ring.tail < low and now - last_drain < LAZY_MAX_AGE_S
                        and not ring.exited_cleanly() and ring.process_alive()
                        and not getattr(pc.writer, "urgent", False)):     # a flight-recorder trigger
                    time.sleep(0.005)
                    continue
                last_drain = now
            ring.recalibrate()
            read_from = ring.tail
            raws = ring.poll(pin_blobs=True)      # blob pieces stay in the ring until written
            burst = ring.tail - read_from >= low // 4
            self._feed(pc, raws)
            if raws and hasattr(pc.writer, "after_feed"):    # the flight recorder's triggers
                pc.writer.after_feed()
            now = time.monotonic()
            if now - last_flush > 0.25 and not pc.disk_error:
                try:
                    pc.writer.flush()
                except OSError:
                    pass
                last_flush = now
            if raws:
                idle_since = None
                continue
            # Nothing published at the tail. Whether the process is gone is asked before the
            # ring is looked at again: a process seen dead adds nothing after, so the ring
            # then holds all it ever wrote. (Asked the other way round, a program that wrote
            # its last records and exited between the two reads lost them.)
            if not ring.process_alive():
                self._drain_dead(pc)
                break
            if ring.exited_cleanly() and ring.head() == ring.tail and self.stop.is_set():
                # exit handlers ran and the program has ended, yet this process still runs
                # (a stuck destructor, an orphan): wait a while for records, then leave it
                idle_since = idle_since or now
                if now - idle_since > LINGER_S:
                    pc.left_running = True
                    break
            else:
                idle_since = None
            time.sleep(0.0005 if now - last_flush < 0.05 else 0.002)

    def _drain_dead(self, pc: ProcessCapture) -> None:
        """The producer is gone: read everything it published, a launch it was inside as a call
        that never returned, step over records it died writing (counted), and count what
        can't be framed. Never stops while a reserved byte is left unread."""
        ring = pc.ring
        while True:
            raws = ring.poll(pin_blobs=True)
            if not raws:
                if ring.head() == ring.tail:
                    return
                raws = ring.poll(pin_blobs=True, dead=True)
            if raws:
                self._feed(pc, raws)
                continue
            if not ring.skip_unpublished():
                ring.give_up()
                return

    def _account(self, pc: ProcessCapture) -> dict:
        """What the snapshot misses: compares the shim's counters with what was written."""
        ring, counts = pc.ring, pc.decoder.counts
        issued = ring.seq_issued()
        written = pc.decoder.seqs.count
        lost = {
            "dropped_records": ring.dropped(),
            "dropped_bytes": ring.dropped_bytes(),
            "undecodable_records": pc.undecodable + counts["undecodable"],
            "unpublished_records": ring.unpublished_records,
            "unpublished_bytes": ring.unpublished_bytes,
            "unread_bytes": ring.unread_bytes,
            "payloads": counts["lost_payloads"],
            "payload_bytes": counts["lost_payload_bytes"],
            "repeated_seqs": pc.decoder.seqs.repeats,
        }
        lost = {k: v for k, v in lost.items() if v}
        return {"seq_issued": issued, "seq_written": written,
                "calls_missing": pc.decoder.seqs.missing_below(issued), "lost": lost}

    def _finish(self, pc: ProcessCapture) -> None:
        recs = pc.decoder.finish()
        if recs:
            self._write(pc, recs)
        loss = pc.loss = self._account(pc)
        lost = loss["lost"]
        msgs = []
        if loss["calls_missing"]:
            msgs.append(f"{loss['calls_missing']} of {loss['seq_issued']} calls missing (sequence numbers never written)")
        if "dropped_records" in lost:
            msgs.append(f"{lost['dropped_records']} records ({lost.get('dropped_bytes', 0)} bytes) dropped: "
                        f"the ring was full and the recorder stopped draining, or a record was larger than half the ring")
        if "undecodable_records" in lost:
            msgs.append(f"{lost['undecodable_records']} records could not be decoded")
        if "unpublished_records" in lost:
            msgs.append(f"the process died while writing {lost['unpublished_records']} records "
                        f"({lost['unpublished_bytes']} bytes)")
        if "unread_bytes" in lost:
            msgs.append(f"{lost['unread_bytes']} bytes the process reserved in its ring could not be read")
        if "payloads" in lost:
            msgs.append(f"{lost['payloads']} payloads ({lost['payload_bytes']} bytes) referenced by calls are missing")
        if "repeated_seqs" in lost:
            msgs.append(f"{lost['repeated_seqs']} call records repeat a sequence number")
        if pc.failure:
            msgs.append(f"the recorder stopped draining on an error ({pc.failure})")
        if msgs:
            pc.partial = True
            self._write(pc, [{"k": "note", "level": "warning", "msg": "incomplete capture: " + "; ".join(msgs)}])
            print(f"cudasnap: warning: {pc.path}: " + "; ".join(msgs) + "; the snapshot is partial", file=sys.stderr)
        if pc.left_running:
            self._write(pc, [{"k": "note", "level": "warning", "msg":
                              f"process {pc.ring.pid} still ran {LINGER_S:.0f} s after its exit handlers and the "
                              f"program's end; records it made after that are not in the snapshot"}])
        clean = pc.ring.exited_cleanly()
        if pc.ring.pid == self.root_pid_getter():
            self.root_exited.wait(10)
            pc.exit_code, pc.signal = self._root_exit
        end = {"k": "end", "exit": pc.exit_code, "signal": pc.signal, "clean_exit": clean, "partial": pc.partial,
               **loss}
        self._write(pc, [end])
        try:
            pc.writer.close()
        except OSError as e:
            print(f"cudasnap: warning: closing {pc.path} failed ({e}); run `cudasnap repair {pc.path}`", file=sys.stderr)
        pc.ring.close()
        try:
            os.unlink(pc.ring.path)
        except OSError:
            pass
        pc.done.set()

    def set_root_exit(self, code: int | None, sig: int | None) -> None:
        self._root_exit = (code, sig)
        self.root_exited.set()

    def finish(self, timeout: float = 600.0) -> list[ProcessCapture]:
        """After the program exited: wait until every ring is drained and closed."""
        self._scan()
        self.stop.set()
        self.watcher.join()
        deadline = time.monotonic() + timeout
        for pc in list(self.procs.values()):
            pc.thread.join(max(0.0, deadline - time.monotonic()))
        return list(self.procs.values())
