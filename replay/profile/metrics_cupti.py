"""Hardware counters for one kernel launch at a time, through CUPTI's range profiler.

Two halves, one libcupti:
- host side (config images, number of passes, metric evaluation): cupti-python's
  `cupti.profiler_host.ProfilerHost` (profiler type RANGE_PROFILER);
- device side (cuptiRangeProfiler*: Enable, GetCounterDataSize, CounterDataImageInitialize,
  SetConfig, Start, Stop, DecodeData, GetCounterDataInfo, CounterDataGetRangeInfo, Disable),
  which cupti-python does not wrap: bound here with cffi in ABI mode (no compiler, nothing
  built at install time), from the declarations of cupti_range_profiler.h,
  cupti_profiler_target.h and cupti_target.h (CUDA 13.5 headers; the structs are laid out by
  cffi as C lays them out, and each call passes the header's *_STRUCT_SIZE: offsetof(last
  field) + sizeof(last field)).

The library bound is the one cupti-python loaded (found in /proc/self/maps after a first host
call), so both halves share one CUPTI; where it is not mapped yet, cuda.pathfinder's
libcupti, then libcupti.so.13 / .12 from the loader path.

Collection, per launch (the caller restores memory between passes, as isolated mode does):
auto ranges (one range per kernel between Start and Stop; where SetConfig refuses them, one
user range pushed around the launch) and user replay: the counter data
image is initialized for one range, SetConfig is given the config image, and each pass is
prepare() (restore memory, flush L2, synchronize), Start, the launch, a synchronize, Stop,
until Stop says every pass was submitted; then DecodeData and the host evaluates the metrics
of range 0.  Range-profiler objects are per context (Enable once per context, Disable at the
end).  CUPTI's own cache control (13.4+) is left off: the caller flushes L2 before each pass
with the same flush isolated mode uses.

A test seam: CUDASNAP_METRICS_COLLECTOR=module:factory makes open_collector() return
factory(device_index) instead (the test double has no CUPTI); the object needs the methods of
RangeProfilerCollector that MetricsProfiler calls: prepare, passes, collect, close, and the
attributes name and chip."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

ENV_COLLECTOR = "CUDASNAP_METRICS_COLLECTOR"

CDEF = """
typedef int CUptiResult;
CUptiResult cuptiGetResultString(CUptiResult result, const char **str);
CUptiResult cuptiGetVersion(uint32_t *version);

typedef struct { size_t structSize; void *pPriv; } CUpti_Profiler_Initialize_Params;
typedef struct { size_t structSize; void *pPriv; } CUpti_Profiler_DeInitialize_Params;
CUptiResult cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *p);
CUptiResult cuptiProfilerDeInitialize(CUpti_Profiler_DeInitialize_Params *p);

typedef struct { size_t structSize; void *pPriv; size_t deviceIndex; const char *pChipName; } CUpti_Device_GetChipName_Params;
CUptiResult cuptiDeviceGetChipName(CUpti_Device_GetChipName_Params *p);

typedef struct {
    size_t structSize; void *pPriv; void *pRangeProfilerObject; size_t configSize; const uint8_t *pConfig;
    size_t counterDataImageSize; uint8_t *pCounterDataImage; int range; int replayMode; size_t maxRangesPerPass;
    uint16_t numNestingLevels; uint16_t minNestingLevel; size_t passIndex; uint16_t targetNestingLevel;
} CUpti_RangeProfiler_SetConfig_Params;
typedef struct { size_t structSize; void *pPriv; void *ctx; void *pRangeProfilerObject; int cacheControlMode; } CUpti_RangeProfiler_Enable_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; } CUpti_RangeProfiler_Disable_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; } CUpti_RangeProfiler_Start_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; const char *pRangeName; } CUpti_RangeProfiler_PushRange_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; } CUpti_RangeProfiler_PopRange_Params;
typedef struct {
    size_t structSize; void *pPriv; void *pRangeProfilerObject; size_t passIndex; size_t targetNestingLevel;
    uint8_t isAllPassSubmitted;
} CUpti_RangeProfiler_Stop_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; size_t numOfRangeDropped; } CUpti_RangeProfiler_DecodeData_Params;
typedef struct {
    size_t structSize; void *pPriv; void *pRangeProfilerObject; const char **pMetricNames; size_t numMetrics;
    size_t maxNumOfRanges; uint32_t maxNumRangeTreeNodes; size_t counterDataSize;
} CUpti_RangeProfiler_GetCounterDataSize_Params;
typedef struct { size_t structSize; void *pPriv; void *pRangeProfilerObject; size_t counterDataSize; uint8_t *pCounterData; } CUpti_RangeProfiler_CounterDataImage_Initialize_Params;
typedef struct { size_t structSize; void *pPriv; const uint8_t *pCounterDataImage; size_t counterDataImageSize; size_t numTotalRanges; } CUpti_RangeProfiler_GetCounterDataInfo_Params;
typedef struct {
    size_t structSize; void *pPriv; const uint8_t *pCounterDataImage; size_t counterDataImageSize; size_t rangeIndex;
    const char *rangeDelimiter; const char *rangeName;
} CUpti_RangeProfiler_CounterData_GetRangeInfo_Params;

CUptiResult cuptiRangeProfilerEnable(CUpti_RangeProfiler_Enable_Params *p);
CUptiResult cuptiRangeProfilerDisable(CUpti_RangeProfiler_Disable_Params *p);
CUptiResult cuptiRangeProfilerStart(CUpti_RangeProfiler_Start_Params *p);
CUptiResult cuptiRangeProfilerStop(CUpti_RangeProfiler_Stop_Params *p);
CUptiResult cuptiRangeProfilerPushRange(CUpti_RangeProfiler_PushRange_Params *p);
CUptiResult cuptiRangeProfilerPopRange(CUpti_RangeProfiler_PopRange_Params *p);
CUptiResult cuptiRangeProfilerSetConfig(CUpti_RangeProfiler_SetConfig_Params *p);
CUptiResult cuptiRangeProfilerDecodeData(CUpti_RangeProfiler_DecodeData_Params *p);
CUptiResult cuptiRangeProfilerGetCounterDataSize(CUpti_RangeProfiler_GetCounterDataSize_Params *p);
CUptiResult cuptiRangeProfilerCounterDataImageInitialize(CUpti_RangeProfiler_CounterDataImage_Initialize_Params *p);
CUptiResult cuptiRangeProfilerGetCounterDataInfo(CUpti_RangeProfiler_GetCounterDataInfo_Params *p);
CUptiResult cuptiRangeProfilerCounterDataGetRangeInfo(CUpti_RangeProfiler_CounterData_GetRangeInfo_Params *p);
"""

# (struct, its last field as the header's *_STRUCT_SIZE macro names it).  Enable's last field,
# cacheControlMode, is new in CUPTI 13.4: its size stops before it, the size older CUPTIs know
# (the field then reads as 0, CUPTI_CACHE_CONTROL_MODE_NONE, on every version).
SIZES = {
    "CUpti_Profiler_Initialize_Params": "pPriv",
    "CUpti_Profiler_DeInitialize_Params": "pPriv",
    "CUpti_Device_GetChipName_Params": "pChipName",
    "CUpti_RangeProfiler_SetConfig_Params": "targetNestingLevel",
    "CUpti_RangeProfiler_Enable_Params": "pRangeProfilerObject",
    "CUpti_RangeProfiler_Disable_Params": "pRangeProfilerObject",
    "CUpti_RangeProfiler_Start_Params": "pRangeProfilerObject",
    "CUpti_RangeProfiler_Stop_Params": "isAllPassSubmitted",
    "CUpti_RangeProfiler_PushRange_Params": "pRangeName",
    "CUpti_RangeProfiler_PopRange_Params": "pRangeProfilerObject",
    "CUpti_RangeProfiler_DecodeData_Params": "numOfRangeDropped",
    "CUpti_RangeProfiler_GetCounterDataSize_Params": "counterDataSize",
    "CUpti_RangeProfiler_CounterDataImage_Initialize_Params": "pCounterData",
    "CUpti_RangeProfiler_GetCounterDataInfo_Params": "numTotalRanges",
    "CUpti_RangeProfiler_CounterData_GetRangeInfo_Params": "rangeName",
}
CUPTI_AUTO_RANGE = 1            # CUpti_ProfilerRange
CUPTI_USER_RANGE = 2
CUPTI_USER_REPLAY = 3           # CUpti_ProfilerReplayMode: INVALID, ApplicationReplay, KernelReplay, UserReplay
CUPTI_ERROR_INSUFFICIENT_PRIVILEGES = 35
MAX_PASSES = 256                # a config that never says "all passes submitted" stops here


class MetricsUnavailable(RuntimeError):
    """CUPTI's profiler cannot be used here (no cupti-python, no libcupti with the range
    profiler, an unsupported GPU, no permission to read counters)."""


def struct_size(ffi, name: str) -> int:
    """The header's *_STRUCT_SIZE: offsetof(last field) + sizeof(last field)."""
    last = SIZES[name]
    ftype = dict(ffi.typeof(name).fields)[last].type
    return ffi.offsetof(name, last) + ffi.sizeof(ftype)


def make_ffi():
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi


def _mapped_libcupti() -> Optional[str]:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if "/libcupti.so" in p:
                    return p
    except OSError:
        pass
    return None


def libcupti_candidates() -> List[str]:
    out = []
    p = _mapped_libcupti()
    if p:
        out.append(p)
    try:
        from cuda import pathfinder
        out.append(pathfinder.load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:
        pass
    return out + ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]


class Cupti:
    """The C entry points bound through cffi, with errors as exceptions naming the call."""

    def __init__(self):
        self.ffi = make_ffi()
        self.lib = None
        self.path = None
        errors = []
        for cand in libcupti_candidates():
            try:
                self.lib = self.ffi.dlopen(cand)
                self.path = cand
                break
            except OSError as e:
                errors.append(f"{cand}: {e}")
        if self.lib is None:
            raise MetricsUnavailable("libcupti could not be loaded (" + "; ".join(errors[-2:]) + ")")
        try:
            self.lib.cuptiRangeProfilerEnable          # CUDA 12.6+ CUPTI
        except (AttributeError, NotImplementedError):
            raise MetricsUnavailable(f"{self.path} has no range profiler (cuptiRangeProfilerEnable: CUPTI of "
                                     f"CUDA 12.6 or later is needed)") from None
        v = self.ffi.new("uint32_t *")
        self.version = int(v[0]) if self.lib.cuptiGetVersion(v) == 0 else None

    def params(self, name: str, **fields):
        p = self.ffi.new(name + " *")
        p.structSize = struct_size(self.ffi, name)
        for k, val in fields.items():
            setattr(p, k, val)
        return p

    def error(self, code: int) -> str:
        s = self.ffi.new("const char **")
        try:
            if self.lib.cuptiGetResultString(code, s) == 0 and s[0] != self.ffi.NULL:
                return self.ffi.string(s[0]).decode(errors="replace")
        except Exception:
            pass
        return f"CUPTI error {code}"

    def call(self, fn: str, p) -> Any:
        code = getattr(self.lib, fn)(p)
        if code != 0:
            err = CuptiCallError(fn, code, self.error(code))
            raise err
        return p


class CuptiCallError(RuntimeError):
    def __init__(self, fn: str, code: int, text: str):
        super().__init__(f"{fn}: {text}")
        self.fn, self.code = fn, code


class RangeProfilerCollector:
    """One GPU's counter collection (see the module doc).  prepare() checks the metrics on
    the host and builds the config image; collect() profiles one launch."""
    name = "cupti range profiler"

    def __init__(self, device_index: int):
        try:
            import numpy  # noqa: F401
            from cupti import profiler_host as ph
        except Exception as e:
            raise MetricsUnavailable(f"cupti-python is not available ({type(e).__name__}: {e}); "
                                     f"pip install cupti-python") from None
        self.np = __import__("numpy")
        self.ph = ph
        try:
            ph.get_supported_chips()            # loads libcupti through cupti-python first
        except Exception as e:
            raise MetricsUnavailable(f"CUPTI's profiler host API failed ({type(e).__name__}: {e})") from None
        self.c = Cupti()
        self.objects: Dict[int, Any] = {}       # live context -> range profiler object
        self.host = None
        self.config = None
        self.metrics: List[str] = []
        self.range_mode = CUPTI_AUTO_RANGE      # user ranges around the launch where auto ranges are refused
        self._initialized = False
        try:
            self.c.call("cuptiProfilerInitialize", self.c.params("CUpti_Profiler_Initialize_Params"))
            self._initialized = True
            p = self.c.call("cuptiDeviceGetChipName", self.c.params("CUpti_Device_GetChipName_Params",
                                                                      deviceIndex=int(device_index)))
            self.chip = self.c.ffi.string(p.pChipName).decode()
        except CuptiCallError as e:
            self.close()
            raise MetricsUnavailable(f"CUPTI profiler: {e}") from None
        try:
            self.host = ph.ProfilerHost(self.chip, ph.ProfilerType.RANGE_PROFILER)
            self.host.initialize()
        except Exception as e:
            self.close()
            raise MetricsUnavailable(f"CUPTI profiler host for {self.chip}: {type(e).__name__}: {e}") from None

    # ---------------------------------------------------------------- host side
    def known(self, metric: str) -> bool:
        """The chip's CUPTI knows the metric: its properties, or else (a name with a submetric the
        properties call may not take) a config image of it alone on a throwaway host object."""
        try:
            self.host.get_metric_properties(metric)
            return True
        except Exception:
            pass
        probe = None
        try:
            probe = self.ph.ProfilerHost(self.chip, self.ph.ProfilerType.RANGE_PROFILER)
            probe.initialize()
            probe.create_config_image([metric])
            return True
        except Exception:
            return False
        finally:
            if probe is not None:
                try:
                    probe.deinitialize()
                except Exception:
                    pass

    def prepare(self, metrics: List[str], warn: Callable[[str], None],
                alternative: Callable[[str], Optional[str]] = lambda m: None) -> Dict[str, str]:
        """Check each metric on this chip (another spelling where the chip knows only that one;
        unknown ones are dropped with a warning) and build the config image.  Returns
        {requested name: name collected}."""
        chosen: Dict[str, str] = {}
        dropped = []
        for m in metrics:
            if self.known(m):
                chosen[m] = m
                continue
            alt = alternative(m)
            if alt and self.known(alt):
                chosen[m] = alt
                continue
            dropped.append(m)
        if dropped:
            warn(f"metrics: {len(dropped)} metric(s) unknown to CUPTI on {self.chip}, not collected: "
                 + ", ".join(dropped[:8]) + (" ..." if len(dropped) > 8 else ""))
        self.metrics = list(dict.fromkeys(chosen.values()))
        if not self.metrics:
            raise MetricsUnavailable(f"none of the requested metrics is known to CUPTI on {self.chip}")
        self.config = self.host.create_config_image(self.metrics)
        return chosen

    def passes(self) -> int:
        return int(self.ph.get_num_of_passes(self.config))

    # ---------------------------------------------------------------- device side
    def _object(self, ctx: int):
        obj = self.objects.get(ctx)
        if obj is None:
            ffi = self.c.ffi
            try:
                p = self.c.call("cuptiRangeProfilerEnable", self.c.params(
                    "CUpti_RangeProfiler_Enable_Params", ctx=ffi.cast("void *", ctx)))
            except CuptiCallError as e:
                if e.code == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
                    raise MetricsUnavailable(
                        "reading GPU performance counters needs permission (ERR_NVGPUCTRPERM): run as root, "
                        "or load the driver with NVreg_RestrictProfilingToAdminUsers=0") from None
                raise MetricsUnavailable(f"CUPTI range profiler: {e}") from None
            obj = p.pRangeProfilerObject
            self.objects[ctx] = obj
        return obj

    def collect(self, ctx: int, prepare: Callable[[], None], launch: Callable[[], None],
                sync: Callable[[], None]) -> Tuple[Dict[str, float], int]:
        """Profile one launch: ({metric: value}, passes run).  prepare() runs before every pass
        (restore memory, flush, synchronize); launch() issues the kernel; sync() waits for it."""
        c, ffi, np = self.c, self.c.ffi, self.np
        obj = self._object(ctx)
        names = [ffi.new("char[]", m.encode()) for m in self.metrics]
        arr = ffi.new("const char *[]", names)
        p = c.call("cuptiRangeProfilerGetCounterDataSize", c.params(
            "CUpti_RangeProfiler_GetCounterDataSize_Params", pRangeProfilerObject=obj, pMetricNames=arr,
            numMetrics=len(self.metrics), maxNumOfRanges=1, maxNumRangeTreeNodes=1))
        image = np.zeros(int(p.counterDataSize), dtype=np.uint8)
        img_ptr = ffi.cast("uint8_t *", image.ctypes.data)
        c.call("cuptiRangeProfilerCounterDataImageInitialize", c.params(
            "CUpti_RangeProfiler_CounterDataImage_Initialize_Params", pRangeProfilerObject=obj,
            counterDataSize=image.size, pCounterData=img_ptr))
        cfg = self.config

        def set_config(mode: int) -> None:
            c.call("cuptiRangeProfilerSetConfig", c.params(
                "CUpti_RangeProfiler_SetConfig_Params", pRangeProfilerObject=obj, configSize=cfg.size,
                pConfig=ffi.cast("const uint8_t *", cfg.ctypes.data), counterDataImageSize=image.size,
                pCounterDataImage=img_ptr, range=mode, replayMode=CUPTI_USER_REPLAY, maxRangesPerPass=1,
                numNestingLevels=1, minNestingLevel=1, passIndex=0, targetNestingLevel=1))
        try:
            set_config(self.range_mode)
        except CuptiCallError:
            if self.range_mode != CUPTI_AUTO_RANGE:
                raise
            self.range_mode = CUPTI_USER_RANGE         # one range pushed around the launch instead
            set_config(self.range_mode)
        user = self.range_mode == CUPTI_USER_RANGE
        rname = ffi.new("char[]", b"launch")
        passes = 0
        while True:
            prepare()
            c.call("cuptiRangeProfilerStart", c.params("CUpti_RangeProfiler_Start_Params", pRangeProfilerObject=obj))
            try:
                if user:
                    c.call("cuptiRangeProfilerPushRange", c.params("CUpti_RangeProfiler_PushRange_Params",
                                                                   pRangeProfilerObject=obj, pRangeName=rname))
                launch()
                sync()
                if user:
                    c.call("cuptiRangeProfilerPopRange", c.params("CUpti_RangeProfiler_PopRange_Params",
                                                                  pRangeProfilerObject=obj))
            finally:
                stop = c.call("cuptiRangeProfilerStop", c.params("CUpti_RangeProfiler_Stop_Params",
                                                                 pRangeProfilerObject=obj))
            passes += 1
            if stop.isAllPassSubmitted:
                break
            if passes >= MAX_PASSES:
                raise RuntimeError(f"CUPTI asked for more than {MAX_PASSES} passes")
        d = c.call("cuptiRangeProfilerDecodeData", c.params("CUpti_RangeProfiler_DecodeData_Params",
                                                            pRangeProfilerObject=obj))
        info = c.call("cuptiRangeProfilerGetCounterDataInfo", c.params(
            "CUpti_RangeProfiler_GetCounterDataInfo_Params", pCounterDataImage=img_ptr,
            counterDataImageSize=image.size))
        if int(info.numTotalRanges) < 1:
            raise RuntimeError(f"CUPTI recorded no range for the launch ({int(d.numOfRangeDropped)} dropped)")
        vals = self.host.evaluate_metric_values(image, self.metrics, 0)
        return {m: float(v) for m, v in zip(self.metrics, vals)}, passes

    def close(self) -> None:
        for obj in list(self.objects.values()):
            try:
                self.c.call("cuptiRangeProfilerDisable", self.c.params("CUpti_RangeProfiler_Disable_Params",
                                                                       pRangeProfilerObject=obj))
            except Exception:
                pass
        self.objects = {}
        if self.host is not None:
            try:
                self.host.deinitialize()
            except Exception:
                pass
            self.host = None
        if self._initialized:
            self._initialized = False
            try:
                self.c.call("cuptiProfilerDeInitialize", self.c.params("CUpti_Profiler_DeInitialize_Params"))
            except Exception:
                pass


def open_collector(device_index: int):
    """The collector for this GPU: CUDASNAP_METRICS_COLLECTOR's factory when set, else CUPTI's
    range profiler.  Raises MetricsUnavailable."""
    spec = os.environ.get(ENV_COLLECTOR)
    if spec:
        import importlib
        mod, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), attr or "collector")
        except Exception as e:
            raise MetricsUnavailable(f"{ENV_COLLECTOR}={spec}: {type(e).__name__}: {e}") from None
        return factory(device_index)
    return RangeProfilerCollector(device_index)
