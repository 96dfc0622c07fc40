"""Replay options and result."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class ReplayOptions:
    device: int = 0
    calls: Optional[str] = None          # call-set spec (formats.callset syntax)
    kernels: Optional[str] = None        # regex on kernel names
    kernel_name: Optional[str] = None    # -k: NAME (exact, on kernel_name_base) or regex:RX (replay/selection.py)
    kernel_name_base: str = "function"   # function | demangled | mangled
    launch_skip: int = 0                 # -s: matching launches skipped first
    launch_count: Optional[int] = None   # -c: matching launches selected at most
    profiler_range: str = "recorded"     # recorded: pass cuProfilerStart/Stop through; workload: around the workload
    rtol: float = 0.0
    atol: float = 0.0
    dtype: Optional[str] = None          # element type of every result (f32 f16 bf16 f64 int)
    dtype_for: List[str] = field(default_factory=list)   # "CALL=TYPE" / "KERNEL=TYPE" (replay/numerics.py)
    tolerance: Optional[str] = None      # exact | torch | rtol=R,atol=A | ulp:N; None: by target (numerics.policy_of)
    exact: bool = False                  # bit-exact whatever the target
    recheck: Optional[bool] = None       # replay again where a result is CLOSE (None: on a GPU only)
    continue_on_error: bool = False
    watchdog: Optional[float] = None     # seconds
    sync_after_launch: bool = False
    threads: bool = False
    progress: Optional[bool] = None      # None: automatic (long replay, stderr is a terminal)
    relocate_payloads: bool = False
    quiet: bool = False
    replace: List[str] = field(default_factory=list)   # TARGET=FILE swaps (replay/replace.py); CUDASNAP_REPLACE adds
    jit: Optional[str] = None            # "ptx": load every module from its PTX (JIT-compiled)
    launch_override: Optional[str] = None   # "grid=X,Y,Z,block=X,Y,Z[,kernel=REGEX]" (replay/override.py)
    devices: Optional[str] = None           # "A,B,...": recorded device i replays on GPU A, B... (replay/devices.py)
    pace: str = "fast"                   # fast: as fast as possible; recorded: keep the recorded host gaps
    # calls in the order of their numbers, not the file's (threads' records lie in the file in the
    # order their buffers were written): a cut at call N then has exactly the calls before N behind it
    call_order: bool = False


@dataclass
class ReplayResult:
    exit_code: int = 0
    first_launch_unix: Optional[float] = None   # wall clock of the first launch (time to first kernel)
    first_launch_mono: Optional[float] = None
    last_launch_mono: Optional[float] = None     # launch rate = launches / (last - first)
    placed: int = 0
    fell_back: int = 0
    fallbacks: List[Dict[str, Any]] = field(default_factory=list)
    d2h_verified: int = 0
    d2h_bytes: int = 0
    d2h_unverified: int = 0
    sample: Optional[Dict[str, Any]] = None   # a simulator's bounded verdict: what was judged (replay/sim/bounded.py)
    d2h_left_out: int = 0                 # D2H results not compared: the selection left out work they depend on
    endstate: Optional[Dict[str, Any]] = None   # a window's end state compared (replay/endstate.py)
    mismatches: List[Dict[str, Any]] = field(default_factory=list)
    numerics: Dict[str, Any] = field(default_factory=dict)   # EXACT/CLOSE/DIFFERENT counts, tolerance (replay/numerics.py)
    rounding_mismatches: int = 0          # of them, D2H results that differ as float rounding does (verify.rounding_hint)
    launches: int = 0
    calls: int = 0                        # call records replayed (executed)
    skipped: int = 0                      # queries and ignored calls (counted, not executed)
    filtered: int = 0                     # launches/copies left out by the selection (-k/-s/-c/--calls/--kernels)
    profiler: Dict[str, Any] = field(default_factory=dict)   # cuProfilerStart/Stop made: range, starts, stops, seqs
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    unreadable_payloads: List[str] = field(default_factory=list)   # payloads the snapshot could not give
    by_family: Dict[str, int] = field(default_factory=dict)
    errors_recurred: int = 0
    host_relocated: int = 0
    payload_stale: List[Dict[str, Any]] = field(default_factory=list)
    params_relocated: int = 0
    arch: List[str] = field(default_factory=list)
    truncated: bool = False
    stopped_at: Optional[int] = None      # seq of the incomplete call replay stopped at
    last_seq: Optional[int] = None
    total_calls: int = 0
    elapsed_s: float = 0.0
    pace: str = "fast"                    # the pace that ran (fast | recorded)
    loop_start_mono: Optional[float] = None   # the replay loop (after start-up: read, plan, driver load)
    loop_end_mono: Optional[float] = None
    init_s: Optional[float] = None        # cuInit, the device's facts and the placement reservation
    startup_s: Dict[str, float] = field(default_factory=dict)   # before the loop: prescan, driver load, profiler start
    # where the loop's time went (replay/profile phase_timings): seconds and counts of the calls replayed one
    # by one, per handler family; module and H2D bytes; cuInit, placement, the end
    phases: Dict[str, Any] = field(default_factory=dict)
    native_calls: int = 0                 # calls (and skipped queries) the C executor ran
    sync_mono: List[List[float]] = field(default_factory=list)   # [seq, time] as each synchronization returned (step boundaries)
    message: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
