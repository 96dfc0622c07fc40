#!/usr/bin/env python3
"""Step-by-step check of CUPTI's profiler host and range profiler on this machine.

Prints each thing tried and its result; exits 0 always.  Runs each variant in a child process
(a process maps one libcupti):
  default   - as the environment is (cupti-python locates libcupti through cuda.pathfinder);
  wheel-ld  - LD_LIBRARY_PATH starts with the nvidia-cuda-cupti wheel's lib folder found on
              sys.path (nvidia/cu13/lib), so pathfinder's loader-path step finds that libcupti;
  wheel-pre - that libcupti (and its libnvperf_*) loaded by absolute path before cupti-python
              (what CUDASNAP_LIBCUPTI=<that folder>/libcupti.so.13 does in cudasnap);
  libcupti-env - CUDASNAP_LIBCUPTI set to $CUDASNAP_LIBCUPTI, else to
              /tmp/site/nvidia/cu13/lib/libcupti.so.13 (a newer nvidia-cuda-cupti wheel installed
              with pip --target /tmp/site), where that file exists: that libcupti preloaded.
In each: the libraries mapped, cuptiGetVersion, cuptiDeviceGetChipName, cuptiProfilerHostInitialize
with the 13.5 headers' struct size (56; only where the libcupti has the 13.2+ host structs) and the
pre-13.2 one (48), with no counter availability image and with one from
cuptiProfilerGetCounterAvailability on a live context, before and after cuptiProfilerInitialize;
cupti-python's ProfilerHost.initialize(); then config images and passes for SpeedOfLight metrics,
cuptiRangeProfilerEnable on the context, cudasnap's trial child (preflight) and its collector.

Each step's name is printed (flushed) before it runs.  A step that kills the variant's process
(CUDA 13.0's cuptiDeviceGetChipName dereferences NULL when called before a successful
cuptiProfilerInitialize) is named with its signal, and the variant is run again without it
(and without each earlier one that crashed), so one crash hides none of the later steps.

    python3 bench/diag/cupti_probe.py                # all variants
    python3 bench/diag/cupti_probe.py default        # one
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

METRICS = ["sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "gpu__time_duration.sum"]

# the product's own declarations (struct layouts of the CUDA 13.5 headers): the probe calls
# what --profile metrics calls, the way it calls it
from cudasnap.replay.profile.metrics_cupti import CDEF  # noqa: E402


SITE_LIBCUPTI = "/tmp/site/nvidia/cu13/lib/libcupti.so.13"
ENV_SKIP = "CUPTI_PROBE_SKIP"            # JSON list of steps that crashed an earlier run of the variant
ENV_STEPFILE = "CUPTI_PROBE_STEPFILE"    # the child writes each step's name there before running it
SKIPPED_STEPS = set(json.loads(os.environ.get(ENV_SKIP) or "[]"))
CRASHED = "SKIPPED (it crashed this variant's process in an earlier run)"
AT_EXIT = "(interpreter exit, after every step)"


def say(step, result):
    print(f"  {step:<58} {result}", flush=True)


def begin(step):
    """Name the step before it runs (stdout, flushed, and the step file), so a crash names it."""
    print(f"  {step:<58} ", end="", flush=True)
    f = os.environ.get(ENV_STEPFILE)
    if f:
        with open(f, "a") as fh:
            fh.write(step + "\n")
            fh.flush()


def attempt(step, fn):
    """Run fn(); print its value or its exception.  Returns the value or None.  A step that
    crashed the process in an earlier run of this variant is skipped."""
    if step in SKIPPED_STEPS:
        say(step, CRASHED)
        return None
    begin(step)
    try:
        v = fn()
        print(f"OK {v if v is not None else ''}".rstrip(), flush=True)
        return v
    except BaseException as e:          # noqa: BLE001 - a probe reports everything
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        return None


def metrics_cupti():
    try:
        from cudasnap.replay.profile import metrics_cupti as mc
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        from replay.profile import metrics_cupti as mc
    return mc


def env_libcupti():
    p = os.environ.get("CUDASNAP_LIBCUPTI") or SITE_LIBCUPTI
    return p if os.path.exists(p) else None


def mapped(*needles):
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(None, 5)[-1].strip()
                if any(n in p for n in needles) and p not in out:
                    out.append(p)
    except OSError as e:
        out.append(f"(maps unreadable: {e})")
    return out


def wheel_lib_dir():
    for d in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_cupti/lib"):
            p = os.path.join(d or ".", sub)
            if glob.glob(os.path.join(p, "libcupti.so*")):
                return os.path.abspath(p)
    return None


# ----------------------------------------------------------------------------------- child
class Probe:
    def __init__(self):
        self.ffi = self.lib = None
        self.chip = None
        self.ctx = None
        self.image = None
        self.host = None                 # a raw host object that initialized
        self.host_1302 = False           # the libcupti has the 13.2+ host structs

    def err(self, code):
        s = self.ffi.new("const char **")
        try:
            if self.lib.cuptiGetResultString(code, s) == 0 and s[0] != self.ffi.NULL:
                return f"{self.ffi.string(s[0]).decode()} ({code})"
        except Exception:
            pass
        return f"CUPTI error {code}"

    def size(self, name, last):
        ft = dict(self.ffi.typeof(name).fields)[last].type
        return self.ffi.offsetof(name, last) + self.ffi.sizeof(ft)

    def call(self, fn, name, last, **fields):
        p = self.ffi.new(name + " *")
        p.structSize = self.size(name, last)
        for k, v in fields.items():
            setattr(p, k, v)
        code = getattr(self.lib, fn)(p)
        if code != 0:
            raise RuntimeError(f"{fn} (structSize {p.structSize}): {self.err(code)}")
        return p

    def host_init(self, last, image):
        ffi = self.ffi
        ptr = ffi.NULL if image is None else ffi.cast("const uint8_t *", image.ctypes.data)
        p = self.call("cuptiProfilerHostInitialize", "CUpti_Profiler_Host_Initialize_Params", last,
                      profilerType=0, pChipName=self._chip, pCounterAvailabilityImage=ptr)
        obj = p.pHostObject
        if self.host is None:
            self.host = obj
        else:
            self.call("cuptiProfilerHostDeinitialize", "CUpti_Profiler_Host_Deinitialize_Params", "pHostObject",
                      pHostObject=obj)
        return f"host object {int(ffi.cast('uintptr_t', obj)):#x}"

    def host_sizes(self, label, names):
        new, old = names
        if self.host_1302:
            return (("pSinglePassMetricSetName", new), ("pHostObject", old))
        say(f"[{label}] raw HostInitialize size {new}", "not tried: this libcupti has no 13.2+ host structs")
        return (("pHostObject", old),)

    def host_round(self, label):
        for last, n in self.host_sizes(label, ("56 (13.2+ headers)", "48 (older)")):
            attempt(f"[{label}] raw HostInitialize size {n}, no image", lambda: self.host_init(last, None))
        if self.image is not None:
            for last, n in self.host_sizes(label, ("56", "48")):
                attempt(f"[{label}] raw HostInitialize size {n}, availability image",
                        lambda: self.host_init(last, self.image))

    def cupti_python_init(self, label):
        from cupti import profiler_host as ph

        def go():
            h = ph.ProfilerHost(self.chip, ph.ProfilerType.RANGE_PROFILER)
            h.initialize()
            cfg = h.create_config_image(METRICS)
            n = ph.get_num_of_passes(cfg)
            h.deinitialize()
            return f"config {cfg.size} B, {n} pass(es)"
        import cupti.cupti as cc
        big = cc.PROFILER_HOST_INITIALIZE_PARAMS_STRUCT_SIZE
        if self.host_1302 or big <= 48:
            attempt(f"[{label}] cupti-python ProfilerHost init+config", go)
        else:
            say(f"[{label}] cupti-python ProfilerHost init+config",
                f"not tried: it passes {big} bytes; this libcupti has no 13.2+ host structs (48)")

        if self.image is not None:
            def low():
                import cupti.cupti as cc
                out = []
                sizes = ((big, "its size"), (48, "48")) if self.host_1302 else ((48, "48"),)
                for ss, nm in sizes:
                    p = cc.ProfilerHostInitializeParams()
                    p.struct_size = ss
                    p.profiler_type = int(ph.ProfilerType.RANGE_PROFILER)
                    p.p_chip_name = self.chip
                    p.p_counter_availability_image = self.image.ctypes.data
                    try:
                        cc.profiler_host_initialize(p.ptr)
                        d = cc.ProfilerHostDeinitializeParams()
                        d.struct_size = cc.PROFILER_HOST_DEINITIALIZE_PARAMS_STRUCT_SIZE
                        d.p_host_object = p.p_host_object
                        cc.profiler_host_deinitialize(d.ptr)
                        out.append(f"{nm} ({ss}): ok")
                    except Exception as e:
                        out.append(f"{nm} ({ss}): {type(e).__name__}: {e}")
                return "; ".join(out)
            attempt(f"[{label}] cupti.cupti profiler_host_initialize + image", low)

    def run(self, mode):
        t0 = time.time()
        print(f"== variant {mode}: LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}", flush=True)
        if mode in ("wheel-pre", "libcupti-env"):
            d = wheel_lib_dir() if mode == "wheel-pre" else os.path.dirname(env_libcupti())
            lib = "libcupti.so.13" if mode == "wheel-pre" else os.path.basename(env_libcupti())

            def pre():
                import ctypes
                for n in ("libnvperf_host.so", "libnvperf_target.so"):
                    if os.path.exists(os.path.join(d, n)):
                        ctypes.CDLL(os.path.join(d, n), mode=ctypes.RTLD_GLOBAL)
                ctypes.CDLL(os.path.join(d, lib), mode=ctypes.RTLD_GLOBAL)
                return os.path.join(d, lib)
            attempt("preload libcupti by absolute path", pre)
        drv = None
        try:
            from cuda.bindings import driver as drv
        except Exception as e:
            say("import cuda.bindings.driver", f"FAILED {e}")
        if drv is not None:
            attempt("cuInit", lambda: drv.cuInit(0)[0])
            attempt("cuDriverGetVersion", lambda: drv.cuDriverGetVersion())
            attempt("cuDeviceGetName(0)", lambda: drv.cuDeviceGetName(64, 0)[1].split(b"\0")[0].decode())
        attempt("cuda.pathfinder version", lambda: __import__("cuda.pathfinder", fromlist=["x"]).__version__)
        attempt("import cupti (cupti-python)", lambda: __import__("cupti").__file__)
        chips = attempt("cupti-python get_supported_chips()",
                        lambda: (lambda l: f"{len(l)} chips, GH100 in list: {'GH100' in l}")(
                            __import__("cupti.profiler_host", fromlist=["x"]).get_supported_chips()))
        for p in mapped("libcupti", "libnvperf", "libcuda.so"):
            say("mapped", p)
        libs = mapped("/libcupti.so")
        if not libs:
            say("libcupti", "none mapped; stopping this variant")
            return
        import cffi
        import numpy as np
        self.ffi = cffi.FFI()
        self.ffi.cdef(CDEF)
        self.lib = self.ffi.dlopen(libs[0])
        v = self.ffi.new("uint32_t *")
        attempt("cuptiGetVersion (rc, version)", lambda: (self.lib.cuptiGetVersion(v), int(v[0])))
        def has_1302():
            try:
                self.host_1302 = bool(self.lib.cuptiProfilerHostGetSinglePassSets)
            except (AttributeError, NotImplementedError):
                self.host_1302 = False
            return self.host_1302
        attempt("libcupti has cuptiProfilerHostGetSinglePassSets (13.2+ host structs)", has_1302)
        pyver = None
        try:
            import cupti.cupti as cc
            pyver = cc.PROFILER_HOST_INITIALIZE_PARAMS_STRUCT_SIZE
        except Exception:
            pass
        say("cupti-python PROFILER_HOST_INITIALIZE_PARAMS_STRUCT_SIZE", pyver)

        def chipname():
            p = self.call("cuptiDeviceGetChipName", "CUpti_Device_GetChipName_Params", "pChipName", deviceIndex=0)
            self.chip = self.ffi.string(p.pChipName).decode()
            self._chip = self.ffi.new("char[]", self.chip.encode())
            return self.chip
        attempt("cuptiDeviceGetChipName(0) before ProfilerInitialize (13.0: NULL deref)", chipname)
        if self.chip is None:
            self.chip = "GH100"
            self._chip = self.ffi.new("char[]", b"GH100")
        self.host_round("before ProfilerInitialize")
        if chips:
            self.cupti_python_init("before ProfilerInitialize")
        attempt("cuptiProfilerInitialize", lambda: self.call("cuptiProfilerInitialize",
                                                             "CUpti_Profiler_Initialize_Params", "pPriv") and None)
        attempt("cuptiDeviceGetChipName(0) after ProfilerInitialize", chipname)
        if drv is not None:
            def ctx():
                e, dev = drv.cuDeviceGet(0)
                e, c = drv.cuDevicePrimaryCtxRetain(dev)
                if int(e) != 0:
                    raise RuntimeError(f"cuDevicePrimaryCtxRetain: {e}")
                e, = drv.cuCtxSetCurrent(c)
                self.ctx = int(c)
                return f"ctx {self.ctx:#x} ({e})"
            attempt("primary context retained and current", ctx)
        if self.ctx:
            for last, n in (("bAllowDeviceLevelCounters", "41"), ("pCounterAvailabilityImage", "40 (older)")):
                def avail(last=last):
                    p = self.call("cuptiProfilerGetCounterAvailability", "CUpti_Profiler_GetCounterAvailability_Params",
                                  last, ctx=self.ffi.cast("void *", self.ctx), bAllowDeviceLevelCounters=1)
                    img = np.zeros(int(p.counterAvailabilityImageSize), dtype=np.uint8)
                    self.call("cuptiProfilerGetCounterAvailability", "CUpti_Profiler_GetCounterAvailability_Params",
                              last, ctx=self.ffi.cast("void *", self.ctx), bAllowDeviceLevelCounters=1,
                              counterAvailabilityImageSize=img.size,
                              pCounterAvailabilityImage=self.ffi.cast("uint8_t *", img.ctypes.data))
                    if self.image is None:
                        self.image = img
                    return f"{img.size} bytes"
                attempt(f"cuptiProfilerGetCounterAvailability size {n}", avail)
        self.host_round("after ProfilerInitialize")
        if chips:
            self.cupti_python_init("after ProfilerInitialize")
        if self.host is not None:
            def config():
                ffi = self.ffi
                keep = [ffi.new("char[]", m.encode()) for m in METRICS]
                arr = ffi.new("const char *[]", keep)
                self.call("cuptiProfilerHostConfigAddMetrics", "CUpti_Profiler_Host_ConfigAddMetrics_Params",
                          "numMetrics", pHostObject=self.host, ppMetricNames=arr, numMetrics=len(METRICS))
                p = self.call("cuptiProfilerHostGetConfigImageSize", "CUpti_Profiler_Host_GetConfigImageSize_Params",
                              "configImageSize", pHostObject=self.host)
                cfg = np.zeros(int(p.configImageSize), dtype=np.uint8)
                self.call("cuptiProfilerHostGetConfigImage", "CUpti_Profiler_Host_GetConfigImage_Params",
                          "pConfigImage", pHostObject=self.host, configImageSize=cfg.size,
                          pConfigImage=ffi.cast("uint8_t *", cfg.ctypes.data))
                q = self.call("cuptiProfilerHostGetNumOfPasses", "CUpti_Profiler_Host_GetNumOfPasses_Params",
                              "numOfPasses", configImageSize=cfg.size, pConfigImage=ffi.cast("uint8_t *", cfg.ctypes.data))
                return f"config {cfg.size} B for {len(METRICS)} SOL metrics, {int(q.numOfPasses)} pass(es)"
            attempt("raw host: config image + GetNumOfPasses", config)
        else:
            say("raw host", "no host object initialized: no config image")
        if self.ctx:
            def enable():
                p = self.call("cuptiRangeProfilerEnable", "CUpti_RangeProfiler_Enable_Params", "pRangeProfilerObject",
                              ctx=self.ffi.cast("void *", self.ctx))
                self.call("cuptiRangeProfilerDisable", "CUpti_RangeProfiler_Disable_Params", "pRangeProfilerObject",
                          pRangeProfilerObject=p.pRangeProfilerObject)
                return "enabled and disabled"
            attempt("cuptiRangeProfilerEnable on the context", enable)

        def trial():
            mc = metrics_cupti()
            return mc.preflight(mc.Cupti(libs[0]), 0, "probe")
        attempt("cudasnap preflight (first initialization in a child)", trial)

        def collector():
            mc = metrics_cupti()
            col = mc.RangeProfilerCollector(0)
            try:
                got = col.prepare(METRICS, lambda m: print("    warn:", m, flush=True))
                return f"{col.describe()}; chip {col.chip}; {len(got)} metrics; {col.passes()} pass(es)"
            finally:
                col.close()
        attempt("cudasnap RangeProfilerCollector(0) + prepare + passes", collector)
        say("elapsed", f"{time.time() - t0:.1f} s")


# ----------------------------------------------------------------------------------- parent
def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        try:
            Probe().run(sys.argv[2])
        except BaseException as e:      # noqa: BLE001
            print(f"  probe stopped: {type(e).__name__}: {e}", flush=True)
        f = os.environ.get(ENV_STEPFILE)
        if f:
            with open(f, "a") as fh:
                fh.write(AT_EXIT + "\n")
        return
    print("== environment", flush=True)
    for k in ("PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDASNAP_LIBCUPTI"):
        say(k, repr(os.environ.get(k)))
    say("python", sys.version.split()[0])
    try:
        import site
        say("site.getsitepackages()", site.getsitepackages())
    except Exception as e:
        say("site.getsitepackages()", e)
    wd = wheel_lib_dir()
    say("nvidia-cuda-cupti wheel lib on sys.path", wd)
    for pat in ("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so*", "/usr/local/cuda/lib64/libcupti.so*",
                "/usr/local/cuda/extras/CUPTI/lib64/libnvperf_host.so"):
        say(f"ls {pat}", glob.glob(pat))
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        say("ldconfig -p | libcupti", [l.strip() for l in out.splitlines() if "libcupti" in l])
    except Exception as e:
        say("ldconfig -p", e)
    say("CUDASNAP_LIBCUPTI or " + SITE_LIBCUPTI, env_libcupti())
    variants = sys.argv[1:] or ["default", "wheel-ld", "wheel-pre", "libcupti-env"]
    for v in variants:
        env = dict(os.environ)
        if v in ("wheel-ld", "wheel-pre") and not wd:
            print(f"== variant {v}: skipped (no wheel lib folder on sys.path)", flush=True)
            continue
        if v == "libcupti-env":
            if not env_libcupti():
                print(f"== variant {v}: skipped (no CUDASNAP_LIBCUPTI, no {SITE_LIBCUPTI})", flush=True)
                continue
            env["CUDASNAP_LIBCUPTI"] = env_libcupti()
        if v == "wheel-ld":
            env["LD_LIBRARY_PATH"] = wd + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        run_variant(v, env)
        sys.stdout.flush()


def run_variant(v, env, runs=8, timeout=120):
    """Run the variant's child; where a step kills it, name the step and run it again without
    that step (its output from that step on), up to `runs` times."""
    import tempfile
    skip = []
    for n in range(runs):
        fd, stepfile = tempfile.mkstemp(prefix="cupti_probe_steps_")
        os.close(fd)
        env = dict(env, **{ENV_SKIP: json.dumps(skip), ENV_STEPFILE: stepfile})
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", v], env=env,
                               capture_output=True, text=True, timeout=timeout)
            out, err, rc = r.stdout, r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = "", None
        except Exception as e:
            print(f"== variant {v}: could not run: {e}", flush=True)
            return
        try:
            with open(stepfile) as f:
                steps = [l.rstrip("\n") for l in f if l.strip()]
            os.unlink(stepfile)
        except OSError:
            steps = []
        if skip:                        # the lines before the last skipped step were printed already
            marker = f"  {skip[-1]:<58} {CRASHED}"
            i = out.find(marker)
            print(f"  -- variant {v} run {n + 1}, without: {', '.join(skip)}", flush=True)
            out = out[i:] if i >= 0 else out
        sys.stdout.write(out)
        last = steps[-1] if steps else None
        if rc is None:
            print(f"TIMED OUT\n== variant {v}: timed out after {timeout} s (in step: {last})", flush=True)
            return
        if rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            print(f"CRASHED ({sig})" if not out.endswith("\n") else "", flush=True)
            print(f"  !! step '{last}' killed the process ({sig}); stderr tail: "
                  + " | ".join(err.strip().splitlines()[-5:]), flush=True)
            if last and last != AT_EXIT and last not in skip:
                skip.append(last)
                continue
            return
        if rc != 0 or err.strip():
            print(f"  (child exit {rc}) stderr tail:\n" + "\n".join(err.splitlines()[-15:]), flush=True)
        return
    print(f"== variant {v}: stopped after {runs} runs", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:          # noqa: BLE001
        print(f"probe stopped: {type(e).__name__}: {e}")
    sys.exit(0)
