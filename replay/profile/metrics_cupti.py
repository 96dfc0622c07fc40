"""Hardware counters for one kernel launch at a time, through CUPTI's range profiler.

Both halves bound here with cffi in ABI mode (no compiler, nothing built at install time) on one
libcupti:
- host side (cuptiProfilerHost*: Initialize, GetMetricProperties, ConfigAddMetrics,
  GetConfigImageSize, GetConfigImage, GetNumOfPasses, EvaluateToGpuValues, Deinitialize),
  profiler type RANGE_PROFILER (CuptiHost);
- device side (cuptiRangeProfiler*: Enable, GetCounterDataSize, CounterDataImageInitialize,
  SetConfig, Start, Stop, DecodeData, GetCounterDataInfo, CounterDataGetRangeInfo, Disable).
The declarations are those of cupti_profiler_host.h, cupti_range_profiler.h,
cupti_profiler_target.h and cupti_target.h (CUDA 13.5 headers; the structs are laid out by cffi
as C lays them out, and each call passes the header's *_STRUCT_SIZE: offsetof(last field) +
sizeof(last field)).  Where a struct grew a field since CUDA 12.6 (OLDER_SIZES), a libcupti
older than the headers refuses the newer size with CUPTI_ERROR_INVALID_PARAMETER and the call is
made again with the older size: cupti-python 13.4's own ProfilerHost passes the 13.2+ size of
CUpti_Profiler_Host_Initialize_Params, which CUDA 13.0's libcupti refused that way.  The host
object is made without a counter availability image (CUPTI accepts none for the chips it knows),
else with one taken on the current context (cuptiProfilerGetCounterAvailability).

The library bound is the one cupti-python loaded through cuda.pathfinder (found in
/proc/self/maps after a first call), so timeline tracing and counters share one CUPTI; where it
is not mapped, cuda.pathfinder's libcupti, then libcupti.so.13 / .12 from the loader path.
CUDASNAP_LIBCUPTI=path loads that libcupti first (see load_libcupti).

Layouts by library: every struct a CUPTI since 12.6 knows has the same fields at the same offsets;
newer CUPTIs only appended fields (checked with gcc against the CUDA 13.0.1 and 13.5 headers:
Host_Initialize +pSinglePassMetricSetName, Host_GetMetricProperties +metricCollectionScope,
GetCounterAvailability +bAllowDeviceLevelCounters, RangeProfiler_Enable +cacheControlMode).  A
libcupti without cuptiProfilerHostGetSinglePassSets (before 13.2) is given the older sizes
(OLDER_SIZES) from the start, never the 13.2+ size of Host_Initialize (56 bytes).

A crash, not an error: CUDA 13.0's cuptiDeviceGetChipName checks structSize == 32 and pPriv ==
NULL, then reads CUPTI's per-device table (a global, + deviceIndex * 0x248) with no check that the
table exists or that deviceIndex is below the device count: called before a successful
cuptiProfilerInitialize (or where the driver did not attach), it dereferences NULL (SIGSEGV; 13.5
checks its initialization first and returns an error).  So the chip name is asked only after
cuptiProfilerInitialize succeeded, for a device index below cuDeviceGetCount, and the first
initialization (cuInit, a context, cuptiProfilerInitialize, cuptiDeviceGetChipName,
cuptiProfilerHostInitialize) is tried first in a short child process on the same libcupti
(preflight; CUDASNAP_CUPTI_PREFLIGHT=0 skips it): where it dies, the profile is refused with
MetricsUnavailable naming the call that crashed, instead of the replay dying.  Where it died in
cuptiDeviceGetChipName on a GPU whose chip the compute capability names (CHIPS_BY_CC), the
rest is tried again in a child with that name and, if it lives, used without the chip-name call.

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
ENV_LIBCUPTI = "CUDASNAP_LIBCUPTI"
ENV_PREFLIGHT = "CUDASNAP_CUPTI_PREFLIGHT"
PREFLIGHT_TIMEOUT_S = 180

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

typedef struct {
    size_t structSize; void *pPriv; void *ctx; size_t counterAvailabilityImageSize; uint8_t *pCounterAvailabilityImage;
    uint8_t bAllowDeviceLevelCounters;
} CUpti_Profiler_GetCounterAvailability_Params;
CUptiResult cuptiProfilerGetCounterAvailability(CUpti_Profiler_GetCounterAvailability_Params *p);

typedef struct {
    size_t structSize; void *pPriv; int profilerType; const char *pChipName; const uint8_t *pCounterAvailabilityImage;
    void *pHostObject; const char *pSinglePassMetricSetName;
} CUpti_Profiler_Host_Initialize_Params;
typedef struct { size_t structSize; void *pPriv; void *pHostObject; } CUpti_Profiler_Host_Deinitialize_Params;
typedef struct {
    size_t structSize; void *pPriv; void *pHostObject; const char *pMetricName; const char *pDescription;
    const char *pHwUnit; const char *pDimUnit; int metricType; int metricCollectionScope;
} CUpti_Profiler_Host_GetMetricProperties_Params;
typedef struct { size_t structSize; void *pPriv; void *pHostObject; const char **ppMetricNames; size_t numMetrics; } CUpti_Profiler_Host_ConfigAddMetrics_Params;
typedef struct { size_t structSize; void *pPriv; void *pHostObject; size_t configImageSize; } CUpti_Profiler_Host_GetConfigImageSize_Params;
typedef struct { size_t structSize; void *pPriv; void *pHostObject; size_t configImageSize; uint8_t *pConfigImage; } CUpti_Profiler_Host_GetConfigImage_Params;
typedef struct { size_t structSize; void *pPriv; size_t configImageSize; uint8_t *pConfigImage; size_t numOfPasses; } CUpti_Profiler_Host_GetNumOfPasses_Params;
typedef struct {
    size_t structSize; void *pPriv; void *pHostObject; const uint8_t *pCounterDataImage; size_t counterDataImageSize;
    size_t rangeIndex; const char **ppMetricNames; size_t numMetrics; double *pMetricValues;
} CUpti_Profiler_Host_EvaluateToGpuValues_Params;
CUptiResult cuptiProfilerHostInitialize(CUpti_Profiler_Host_Initialize_Params *p);
CUptiResult cuptiProfilerHostDeinitialize(CUpti_Profiler_Host_Deinitialize_Params *p);
CUptiResult cuptiProfilerHostGetMetricProperties(CUpti_Profiler_Host_GetMetricProperties_Params *p);
CUptiResult cuptiProfilerHostConfigAddMetrics(CUpti_Profiler_Host_ConfigAddMetrics_Params *p);
CUptiResult cuptiProfilerHostGetConfigImageSize(CUpti_Profiler_Host_GetConfigImageSize_Params *p);
CUptiResult cuptiProfilerHostGetConfigImage(CUpti_Profiler_Host_GetConfigImage_Params *p);
CUptiResult cuptiProfilerHostGetNumOfPasses(CUpti_Profiler_Host_GetNumOfPasses_Params *p);
CUptiResult cuptiProfilerHostEvaluateToGpuValues(CUpti_Profiler_Host_EvaluateToGpuValues_Params *p);
CUptiResult cuptiProfilerHostGetSinglePassSets(void *p);      /* 13.2+: only looked up, never called */
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
    "CUpti_Profiler_GetCounterAvailability_Params": "bAllowDeviceLevelCounters",
    "CUpti_Profiler_Host_Initialize_Params": "pSinglePassMetricSetName",
    "CUpti_Profiler_Host_Deinitialize_Params": "pHostObject",
    "CUpti_Profiler_Host_GetMetricProperties_Params": "metricCollectionScope",
    "CUpti_Profiler_Host_ConfigAddMetrics_Params": "numMetrics",
    "CUpti_Profiler_Host_GetConfigImageSize_Params": "configImageSize",
    "CUpti_Profiler_Host_GetConfigImage_Params": "pConfigImage",
    "CUpti_Profiler_Host_GetNumOfPasses_Params": "numOfPasses",
    "CUpti_Profiler_Host_EvaluateToGpuValues_Params": "pMetricValues",
}
# The sizes the same structs had before a field was appended (CUPTI of CUDA 12.6 .. 13.1: Initialize
# without pSinglePassMetricSetName, GetMetricProperties without metricCollectionScope; 13.0.1's
# GetCounterAvailability without bAllowDeviceLevelCounters).  A libcupti without
# cuptiProfilerHostGetSinglePassSets gets these sizes from the start; a newer one that still
# answers CUPTI_ERROR_INVALID_PARAMETER to the newer size is asked again with the older one.
OLDER_SIZES = {
    "CUpti_Profiler_Host_Initialize_Params": "pHostObject",
    "CUpti_Profiler_Host_GetMetricProperties_Params": "metricType",
    "CUpti_Profiler_GetCounterAvailability_Params": "pCounterAvailabilityImage",
}
CUPTI_ERROR_INVALID_PARAMETER = 1
CUPTI_PROFILER_TYPE_RANGE_PROFILER = 0
CUPTI_AUTO_RANGE = 1            # CUpti_ProfilerRange
CUPTI_USER_RANGE = 2
CUPTI_USER_REPLAY = 3           # CUpti_ProfilerReplayMode: INVALID, ApplicationReplay, KernelReplay, UserReplay
CUPTI_ERROR_INSUFFICIENT_PRIVILEGES = 35
MAX_PASSES = 256                # a config that never says "all passes submitted" stops here
# Chips a compute capability names on its own (used only where cuptiDeviceGetChipName crashed).
CHIPS_BY_CC = {(7, 0): "GV100", (8, 0): "GA100", (9, 0): "GH100"}


class MetricsUnavailable(RuntimeError):
    """CUPTI's profiler cannot be used here (no cupti-python, no libcupti with the range
    profiler, an unsupported GPU, no permission to read counters)."""


def struct_size(ffi, name: str, last: Optional[str] = None) -> int:
    """The header's *_STRUCT_SIZE: offsetof(last field) + sizeof(last field) (last: another
    field taken as the last one, for the size an older CUPTI knows)."""
    last = last or SIZES[name]
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


def load_libcupti() -> str:
    """Have one libcupti mapped in the process before anything binds it; returns how it came.

    CUDASNAP_LIBCUPTI=path (a libcupti.so.13) is loaded first where none is mapped yet, with the
    libnvperf_host/target.so beside it (CUPTI opens them by name for the profiler): cupti-python
    (through cuda.pathfinder) then takes the library already loaded.  Otherwise cupti-python picks
    it: pathfinder looks in site-packages (a wheel installed with pip --target onto PYTHONPATH is
    not there), then the loader path (LD_LIBRARY_PATH), then the CUDA toolkit (CUDA_HOME or the
    one libcudart comes from), whose CUPTI may be older than the cupti-python wheel's headers."""
    want = os.environ.get(ENV_LIBCUPTI)
    how = ""
    if want and _mapped_libcupti() is None:
        import ctypes
        d = os.path.dirname(os.path.abspath(want))
        try:
            for dep in ("libnvperf_host.so", "libnvperf_target.so"):
                if os.path.exists(os.path.join(d, dep)):
                    ctypes.CDLL(os.path.join(d, dep), mode=ctypes.RTLD_GLOBAL)
            ctypes.CDLL(want, mode=ctypes.RTLD_GLOBAL)
            how = f"{ENV_LIBCUPTI}"
        except OSError as e:
            raise MetricsUnavailable(f"{ENV_LIBCUPTI}={want}: {e}") from None
    try:
        from cupti import profiler_host as ph
    except Exception as e:
        raise MetricsUnavailable(f"cupti-python is not available ({type(e).__name__}: {e}); "
                                 f"pip install cupti-python") from None
    try:
        ph.get_supported_chips()                # loads libcupti through cupti-python
        how = how or "found by cupti-python"
    except Exception as e:
        how = how or f"cupti-python could not load it: {type(e).__name__}: {e}"
    return how


class Cupti:
    """The C entry points bound through cffi, with errors as exceptions naming the call."""

    def __init__(self, path: Optional[str] = None):
        self.ffi = make_ffi()
        self.lib = None
        self.path = None
        errors = []
        for cand in ([path] if path else libcupti_candidates()):
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
        # 13.2+ host structs (Host_Initialize with pSinglePassMetricSetName)
        self.host_1302 = self.has("cuptiProfilerHostGetSinglePassSets")

    def has(self, fn: str) -> bool:
        try:
            return bool(getattr(self.lib, fn))
        except (AttributeError, NotImplementedError):
            return False

    def version_text(self) -> str:
        v = self.version
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v and v >= 130000 else str(v)

    def last_field(self, name: str) -> Optional[str]:
        """The last field of the struct as this libcupti knows it (None: the headers' own)."""
        return OLDER_SIZES.get(name) if not self.host_1302 else None

    def params(self, name: str, _last: Optional[str] = None, **fields):
        p = self.ffi.new(name + " *")
        p.structSize = struct_size(self.ffi, name, _last or self.last_field(name))
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

    def call_sized(self, fn: str, name: str, **fields) -> Any:
        """call() with the struct size this libcupti knows (last_field), and where a newer one
        refuses the headers' size as an invalid parameter, with the size the struct had before
        its last field was added (OLDER_SIZES)."""
        try:
            return self.call(fn, self.params(name, **fields))
        except CuptiCallError as e:
            if e.code != CUPTI_ERROR_INVALID_PARAMETER or name not in OLDER_SIZES or self.last_field(name):
                raise
            first = e
        try:
            return self.call(fn, self.params(name, OLDER_SIZES[name], **fields))
        except CuptiCallError as e:
            e.args = (f"{e} (struct size {struct_size(self.ffi, name, OLDER_SIZES[name])}; with "
                      f"{struct_size(self.ffi, name)}: {first.text})",)
            raise

    def chip_name(self, device_index: int, device_count: Optional[int] = None) -> str:
        """cuptiDeviceGetChipName, to be called only after cuptiProfilerInitialize succeeded
        (CUDA 13.0's dereferences its device table unchecked: see the module doc)."""
        if device_index < 0 or (device_count is not None and device_index >= device_count):
            raise MetricsUnavailable(f"device {device_index} is not one of the {device_count} CUDA devices")
        p = self.call("cuptiDeviceGetChipName", self.params("CUpti_Device_GetChipName_Params",
                                                            deviceIndex=int(device_index)))
        if p.pChipName == self.ffi.NULL:
            raise CuptiCallError("cuptiDeviceGetChipName", 0, "no chip name (NULL)")
        return self.ffi.string(p.pChipName).decode()

    def counter_availability(self, ctx=None):
        """The counter availability image of ctx (None: the current context)."""
        import numpy as np
        ffi = self.ffi
        c = ffi.NULL if not ctx else ffi.cast("void *", ctx)
        p = self.call_sized("cuptiProfilerGetCounterAvailability", "CUpti_Profiler_GetCounterAvailability_Params",
                            ctx=c, bAllowDeviceLevelCounters=1)
        image = np.zeros(int(p.counterAvailabilityImageSize), dtype=np.uint8)
        self.call_sized("cuptiProfilerGetCounterAvailability", "CUpti_Profiler_GetCounterAvailability_Params",
                        ctx=c, bAllowDeviceLevelCounters=1, counterAvailabilityImageSize=image.size,
                        pCounterAvailabilityImage=ffi.cast("uint8_t *", image.ctypes.data))
        return image


class CuptiCallError(RuntimeError):
    def __init__(self, fn: str, code: int, text: str):
        super().__init__(f"{fn}: {text}")
        self.fn, self.code, self.text = fn, code, text


class CuptiHost:
    """CUPTI's profiler host API (config images, passes, metric evaluation) for one chip, bound
    through cffi on the same libcupti as the device side.  cupti-python's ProfilerHost fills its
    structs with its own headers' sizes, which a libcupti of another CUDA version may refuse
    (CUPTI_ERROR_INVALID_PARAMETER from cuptiProfilerHostInitialize: CUPTI 13.0 with cupti-python
    13.4); here each call falls back to the older size (Cupti.call_sized).

    Initialization tries no counter availability image first (accepted for the chips a CUPTI knows
    at its release), then an image taken on the current context when one is given."""

    def __init__(self, c: Cupti, chip: str):
        self.c, self.chip = c, chip
        self.obj = None
        self.image = None           # the counter availability image the host object was made with
        self._chip = c.ffi.new("char[]", chip.encode())

    def _init(self, image) -> None:
        ffi = self.c.ffi
        ptr = ffi.NULL if image is None else ffi.cast("const uint8_t *", image.ctypes.data)
        p = self.c.call_sized("cuptiProfilerHostInitialize", "CUpti_Profiler_Host_Initialize_Params",
                              profilerType=CUPTI_PROFILER_TYPE_RANGE_PROFILER, pChipName=self._chip,
                              pCounterAvailabilityImage=ptr)
        self.obj, self.image = p.pHostObject, image

    def initialize(self, availability: Optional[Callable[[], Any]] = None) -> "CuptiHost":
        """Raises CuptiCallError (every attempt named) when no attempt is accepted."""
        tried = []
        try:
            self._init(None)
            return self
        except CuptiCallError as e:
            if availability is None or e.code != CUPTI_ERROR_INVALID_PARAMETER:
                raise
            tried.append(f"without a counter availability image: {e}")
        try:
            image = availability()
        except Exception as e:
            raise CuptiCallError("cuptiProfilerHostInitialize", CUPTI_ERROR_INVALID_PARAMETER,
                                 "; ".join(tried + [f"no counter availability image ({e})"])) from None
        try:
            self._init(image)
        except CuptiCallError as e:
            raise CuptiCallError(e.fn, e.code, "; ".join(tried + [f"with a counter availability image: {e}"])) from None
        return self

    def spawn(self) -> "CuptiHost":
        """Another host object made as this one was."""
        h = CuptiHost(self.c, self.chip)
        h._init(self.image)
        return h

    def _names(self, metrics: List[str]):
        ffi = self.c.ffi
        keep = [ffi.new("char[]", m.encode()) for m in metrics]
        return keep, ffi.new("const char *[]", keep)

    def metric_properties(self, metric: str) -> Dict[str, Any]:
        ffi = self.c.ffi
        name = ffi.new("char[]", metric.encode())
        p = self.c.call_sized("cuptiProfilerHostGetMetricProperties", "CUpti_Profiler_Host_GetMetricProperties_Params",
                              pHostObject=self.obj, pMetricName=name)
        s = lambda v: ffi.string(v).decode(errors="replace") if v != ffi.NULL else ""
        return {"description": s(p.pDescription), "hw_unit": s(p.pHwUnit), "dim_unit": s(p.pDimUnit),
                "metric_type": int(p.metricType)}

    def create_config_image(self, metrics: List[str]):
        import numpy as np
        c, ffi = self.c, self.c.ffi
        keep, arr = self._names(metrics)
        c.call("cuptiProfilerHostConfigAddMetrics", c.params("CUpti_Profiler_Host_ConfigAddMetrics_Params",
                                                             pHostObject=self.obj, ppMetricNames=arr,
                                                             numMetrics=len(metrics)))
        p = c.call("cuptiProfilerHostGetConfigImageSize", c.params("CUpti_Profiler_Host_GetConfigImageSize_Params",
                                                                   pHostObject=self.obj))
        image = np.zeros(int(p.configImageSize), dtype=np.uint8)
        c.call("cuptiProfilerHostGetConfigImage", c.params(
            "CUpti_Profiler_Host_GetConfigImage_Params", pHostObject=self.obj, configImageSize=image.size,
            pConfigImage=ffi.cast("uint8_t *", image.ctypes.data)))
        return image

    def num_passes(self, config) -> int:
        c = self.c
        p = c.call("cuptiProfilerHostGetNumOfPasses", c.params(
            "CUpti_Profiler_Host_GetNumOfPasses_Params", configImageSize=config.size,
            pConfigImage=c.ffi.cast("uint8_t *", config.ctypes.data)))
        return int(p.numOfPasses)

    def evaluate(self, counter_data, metrics: List[str], index: int) -> List[float]:
        import numpy as np
        c, ffi = self.c, self.c.ffi
        keep, arr = self._names(metrics)
        vals = np.zeros(len(metrics), dtype=np.float64)
        c.call("cuptiProfilerHostEvaluateToGpuValues", c.params(
            "CUpti_Profiler_Host_EvaluateToGpuValues_Params", pHostObject=self.obj,
            pCounterDataImage=ffi.cast("const uint8_t *", counter_data.ctypes.data),
            counterDataImageSize=counter_data.size, rangeIndex=int(index), ppMetricNames=arr,
            numMetrics=len(metrics), pMetricValues=ffi.cast("double *", vals.ctypes.data)))
        return [float(v) for v in vals]

    def close(self) -> None:
        if self.obj is not None:
            obj, self.obj = self.obj, None
            try:
                self.c.call("cuptiProfilerHostDeinitialize", self.c.params("CUpti_Profiler_Host_Deinitialize_Params",
                                                                           pHostObject=obj))
            except Exception:
                pass


class RangeProfilerCollector:
    """One GPU's counter collection (see the module doc).  prepare() checks the metrics on
    the host and builds the config image; collect() profiles one launch."""
    name = "cupti range profiler"

    def __init__(self, device_index: int):
        self.loaded_by = load_libcupti()
        try:
            import numpy  # noqa: F401
        except Exception as e:
            raise MetricsUnavailable(f"numpy is not available ({type(e).__name__}: {e})") from None
        self.np = __import__("numpy")
        self.c = Cupti()
        self.chip = None
        self.trial: Dict[str, Any] = {}
        if os.environ.get(ENV_PREFLIGHT, "1") != "0":
            self.trial = preflight(self.c, device_index, self.loaded_by)   # MetricsUnavailable where it dies
        self.objects: Dict[int, Any] = {}       # live context -> range profiler object
        self.host: Optional[CuptiHost] = None
        self.config = None
        self.metrics: List[str] = []
        self.range_mode = CUPTI_AUTO_RANGE      # user ranges around the launch where auto ranges are refused
        self._initialized = False
        try:
            self.c.call("cuptiProfilerInitialize", self.c.params("CUpti_Profiler_Initialize_Params"))
            self._initialized = True
            if self.trial.get("chip_from") == "compute capability":
                self.chip = self.trial["chip"]              # cuptiDeviceGetChipName crashed in the trial
            else:
                self.chip = self.c.chip_name(int(device_index), self.trial.get("device_count") or _device_count())
        except (CuptiCallError, MetricsUnavailable) as e:
            self.close()
            raise MetricsUnavailable(f"CUPTI profiler ({self.describe()}): {e}") from None
        try:
            self.host = CuptiHost(self.c, self.chip).initialize(self.counter_availability)
        except CuptiCallError as e:
            self.host = None
            self.close()
            raise MetricsUnavailable(f"CUPTI profiler host for {self.chip} ({self.describe()}): {e}") from None

    def describe(self) -> str:
        """The libcupti in use: its path, version, and how it was found."""
        how = f", {self.loaded_by}" if self.loaded_by else ""
        if self.trial.get("chip_from"):
            how += (f", chip name from the {self.trial['chip_from']} (cuptiDeviceGetChipName: "
                    f"{self.trial.get('chip_name_crash')} in a trial process)")
        return f"{self.c.path}, CUPTI {self.c.version_text()}{how}"

    def counter_availability(self):
        """The counter availability image of the current context (the replay's, current when the
        collector is opened before a launch)."""
        return self.c.counter_availability(None)

    # ---------------------------------------------------------------- host side
    def known(self, metric: str) -> bool:
        """The chip's CUPTI knows the metric: its properties, or else (a name with a submetric the
        properties call may not take) a config image of it alone on a throwaway host object."""
        try:
            self.host.metric_properties(metric)
            return True
        except Exception:
            pass
        probe = None
        try:
            probe = self.host.spawn()
            probe.create_config_image([metric])
            return True
        except Exception:
            return False
        finally:
            if probe is not None:
                probe.close()

    def prepare(self, metrics: List[str], warn: Callable[[str], None],
                alternative: Callable[[str], Optional[str]] = lambda m: None,
                quiet: frozenset = frozenset()) -> Dict[str, str]:
        """Check each metric on this chip (another spelling where the chip knows only that one;
        unknown ones are dropped, with a warning unless in `quiet`) and build the config image.
        Returns {requested name: name collected}."""
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
            if m not in quiet:
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
        return self.host.num_passes(self.config)

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
        vals = self.host.evaluate(image, self.metrics, 0)
        return dict(zip(self.metrics, vals)), passes

    def close(self) -> None:
        for obj in list(self.objects.values()):
            try:
                self.c.call("cuptiRangeProfilerDisable", self.c.params("CUpti_RangeProfiler_Disable_Params",
                                                                       pRangeProfilerObject=obj))
            except Exception:
                pass
        self.objects = {}
        if self.host is not None:
            self.host.close()
            self.host = None
        if self._initialized:
            self._initialized = False
            try:
                self.c.call("cuptiProfilerDeInitialize", self.c.params("CUpti_Profiler_DeInitialize_Params"))
            except Exception:
                pass


def _mapped_paths(*needles: str) -> List[str]:
    out: List[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if p.startswith("/") and any(n in p for n in needles) and p not in out:
                    out.append(p)
    except OSError:
        pass
    return out


def _device_count() -> Optional[int]:
    """cuDeviceGetCount where the driver is initialized in this process, else None."""
    try:
        import ctypes
        n = ctypes.c_int(0)
        return n.value if ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(n)) == 0 else None
    except Exception:
        return None


def _trial(path: str, device_index: int, preload: List[str], chip: Optional[str]) -> Dict[str, Any]:
    """Run the first initialization in a child process (see _trial_main): {"rc", "step" (the last
    one begun), "cc", "result" (None where it died), "stderr"}."""
    import json
    import subprocess
    import sys
    arg = json.dumps({"path": path, "device": int(device_index), "preload": preload, "chip": chip})
    code = ("import sys, runpy; sys.path.pop(0); f = sys.argv[1]; sys.argv = [f, '--cupti-trial', sys.argv[2]]; "
            "runpy.run_path(f, run_name='__main__')")
    try:
        # a process of its own: a CUPTI trial: a profiler's first start may crash or hang its process
        r = subprocess.run([sys.executable, "-c", code, os.path.abspath(__file__), arg], capture_output=True,
                           text=True, timeout=PREFLIGHT_TIMEOUT_S)
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = f"did not finish in {PREFLIGHT_TIMEOUT_S} s", None
    got: Dict[str, Any] = {"rc": rc, "step": None, "cc": None, "result": None,
                           "stderr": " | ".join(err.strip().splitlines()[-3:])}
    for line in out.splitlines():
        if line.startswith("step "):
            got["step"] = line[5:].strip()
        elif line.startswith("cc "):
            try:
                got["cc"] = tuple(int(x) for x in line.split()[1:3])
            except ValueError:
                pass
        elif line.startswith("result "):
            try:
                got["result"] = json.loads(line[7:])
            except ValueError:
                pass
    return got


def _death(t: Dict[str, Any]) -> str:
    rc = t["rc"]
    if rc is None:
        how = t["stderr"]
    elif rc < 0:
        import signal
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exit {rc}" + (f": {t['stderr']}" if t["stderr"] else "")
    return f"{how} in {t['step'] or 'its start'}"


def preflight(c: "Cupti", device_index: int, loaded_by: str = "") -> Dict[str, Any]:
    """The first initialization of CUPTI's profiler tried in a child process on the same libcupti
    (and libnvperf_* where mapped here), so that a CUPTI that crashes on it (CUDA 13.0's
    cuptiDeviceGetChipName: see the module doc) refuses the profile instead of ending the replay.
    Returns the child's findings (chip, device_count, errors it answered with; chip_from where the
    chip name came from the compute capability); raises MetricsUnavailable where the child died."""
    preload = _mapped_paths("/libnvperf_host.so", "/libnvperf_target.so")
    first = _trial(c.path, device_index, preload, None)
    if first["result"] is not None:
        return first["result"]
    what = f"{c.path} (CUPTI {c.version_text()}" + (f", {loaded_by}" if loaded_by else "") + ")"
    why = f"the first initialization of CUPTI's profiler, tried in a child process, died ({_death(first)})"
    cc = first["cc"]
    if first["step"] == "cuptiDeviceGetChipName" and cc in CHIPS_BY_CC:
        chip = CHIPS_BY_CC[cc]
        second = _trial(c.path, device_index, preload, chip)
        if second["result"] is not None:
            r = dict(second["result"])
            r.update(chip=chip, chip_from="compute capability", chip_name_crash=_death(first))
            return r
        why += f"; again with the chip name {chip} of compute capability {cc[0]}.{cc[1]} ({_death(second)})"
    hint = ""
    if first["step"] not in (None, "preload", "cuInit", "cuDevicePrimaryCtxRetain"):
        hint = (f"; a libcupti of a newer CUDA may drive it: {ENV_LIBCUPTI}=<dir>/libcupti.so.13 "
                f"(pip install nvidia-cuda-cupti: nvidia/cu13/lib)")
    raise MetricsUnavailable(f"{what}: {why}{hint}")


def _trial_main(arg: str) -> int:
    """The child of preflight(): each step named on stdout before it begins, then one "result"
    line (JSON).  Mirrors RangeProfilerCollector.__init__: cuInit and the device's primary
    context current, cuptiProfilerInitialize, cuptiDeviceGetChipName (only after a successful
    initialize), cuptiProfilerHostInitialize (the layouts this libcupti knows), deinitialization."""
    import ctypes
    import json
    a = json.loads(arg)
    idx = int(a["device"])
    out: Dict[str, Any] = {}

    def step(name: str) -> None:
        print("step " + name, flush=True)

    def done() -> int:
        print("result " + json.dumps(out), flush=True)
        return 0
    step("preload")
    for p in a.get("preload") or []:
        try:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            out.setdefault("notes", []).append(f"{p}: {e}")
    step("cuInit")
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        rc = cu.cuInit(0)
        n, dev, v = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if rc == 0 and cu.cuDeviceGetCount(ctypes.byref(n)) == 0:
            out["device_count"] = n.value
        if rc == 0 and cu.cuDeviceGet(ctypes.byref(dev), idx) == 0:
            cc = []
            for attr in (75, 76):           # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
                cc.append(v.value if cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) == 0 else -1)
            print(f"cc {cc[0]} {cc[1]}", flush=True)
            out["cc"] = cc
            step("cuDevicePrimaryCtxRetain")
            ctx = ctypes.c_void_p()
            e = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            if e == 0:
                cu.cuCtxSetCurrent(ctx)
            else:
                out.setdefault("notes", []).append(f"cuDevicePrimaryCtxRetain: CUresult {e}")
        else:
            out.setdefault("notes", []).append(f"cuInit: CUresult {rc}")
    except OSError as e:
        out.setdefault("notes", []).append(f"libcuda.so.1: {e}")
    step("load libcupti")
    c = Cupti(a["path"])
    out["version"] = c.version
    step("cuptiProfilerInitialize")
    try:
        c.call("cuptiProfilerInitialize", c.params("CUpti_Profiler_Initialize_Params"))
    except CuptiCallError as e:
        out["error"] = str(e)
        return done()
    chip = a.get("chip")
    if not chip:
        step("cuptiDeviceGetChipName")
        try:
            chip = c.chip_name(idx, out.get("device_count"))
        except (CuptiCallError, MetricsUnavailable) as e:
            out["error"] = str(e)
            return done()
    out["chip"] = chip
    step("cuptiProfilerHostInitialize")
    host = CuptiHost(c, chip)
    try:
        host.initialize(lambda: c.counter_availability(None))
        step("cuptiProfilerHostDeinitialize")
        host.close()
    except CuptiCallError as e:
        out["host_error"] = str(e)
    step("cuptiProfilerDeInitialize")
    try:
        c.call("cuptiProfilerDeInitialize", c.params("CUpti_Profiler_DeInitialize_Params"))
    except CuptiCallError as e:
        out.setdefault("notes", []).append(str(e))
    return done()


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


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--cupti-trial":
        sys.exit(_trial_main(sys.argv[2]))
