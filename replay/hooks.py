"""Replay hooks: small Python plugins that watch a replay.

    cudasnap replay X.cusnap --hook mymod:MyHook
    cudasnap replay X.cusnap --hook 'examples/hooks/dump_buffers.py:DumpBuffers?kernel=saxpy&out=dumps'

A hook spec is MODULE:OBJECT[?key=value&key=value].  MODULE is an importable module name or
a path to a .py file.  OBJECT is a class or factory (called with the query's keyword
arguments, values as strings) or a ready object.  From Python, pass objects directly:
`profile_replay(path, ProfileConfig(), hooks=[MyHook()])`.

A hook defines any of these methods (all optional):

    start(event)          RunEvent: event.replay, event.path
    before_launch(event)  LaunchEvent (replay/events.py): name, grid, block, shmem, stream,
    after_launch(event)     rec_stream, params (bytes as launched), rec_params, layout
                            ([(offset, size)]), param_values(), pointer_params(), module, seq,
                            index, data (scratch dict), ctx: read_device(addr, n),
                            allocation_of(addr), request_timing() (in before_launch) then
                            event.elapsed_ms() (in after_launch)
    before_copy(event)    CopyEvent: call, direction (HtoD DtoH DtoD memset ...), nbytes,
    copy(event)             dst, src, rec_stream, seq
    before_graph_launch(event)  CallEvent of a recorded cuGraphLaunch (its kernels run now:
    graph_launch(event)           they were recorded as graph nodes, not launches)
    sync(event)           CallEvent: call, seq, rec
    end(event)            EndEvent: result (ReplayResult)

Every event carries `replay`, the replay's view (replay/view.py: driver calls, recorded to live
addresses, allocations, streams, kernel names, the snapshot's records), never the Replayer.

Hooks fail open: an exception in a hook is reported (stderr and the replay's warnings) and
replay continues.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Dict
from urllib.parse import parse_qsl

METHODS = {"start": "start", "before_launch": "before_launch", "after_launch": "after_launch",
           "before_copy": "before_copy", "copy": "copy", "before_graph_launch": "before_graph_launch",
           "graph_launch": "graph_launch", "sync": "sync", "end": "end"}


class HookError(Exception):
    pass


def _import(modname: str):
    if modname.endswith(".py") or os.sep in modname:
        path = os.path.abspath(modname)
        if not os.path.exists(path):
            raise HookError(f"hook module {modname}: no such file")
        name = "cudasnap_hook_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(modname)


def load_hook(spec: str) -> Any:
    """'module:object[?k=v&...]' -> hook object."""
    spec, _, query = spec.partition("?")
    modname, sep, objname = spec.rpartition(":")
    if not sep or not modname or not objname:
        raise HookError(f"--hook {spec!r}: expected MODULE:OBJECT")
    try:
        mod = _import(modname)
    except HookError:
        raise
    except Exception as e:
        raise HookError(f"--hook {spec}: cannot import {modname}: {type(e).__name__}: {e}")
    obj = mod
    for part in objname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise HookError(f"--hook {spec}: {modname} has no {objname}")
    kw: Dict[str, str] = dict(parse_qsl(query, keep_blank_values=True))
    if isinstance(obj, type) or (callable(obj) and not any(hasattr(obj, m) for m in METHODS)):
        try:
            obj = obj(**kw)
        except Exception as e:
            raise HookError(f"--hook {spec}: {objname}({', '.join(f'{k}={v!r}' for k, v in kw.items())}) "
                            f"failed: {type(e).__name__}: {e}")
    elif kw:
        raise HookError(f"--hook {spec}: options given but {objname} is not a class or factory")
    return obj


class HookAdapter:
    """A replay subscriber that calls a hook's methods, failing open."""

    def __init__(self, hook: Any, warn: Callable[[str], None] = lambda m: None, stream=None):
        self.hook = hook
        self.warn = warn
        self.stream = stream if stream is not None else sys.stderr
        self.label = f"hook {getattr(hook, 'name', None) or type(hook).__name__}"
        self.errors: Dict[str, int] = {}
        self._methods = {k: getattr(hook, m) for k, m in METHODS.items() if callable(getattr(hook, m, None))}

    def on_event(self, kind: str, ev) -> None:
        fn = self._methods.get(kind)
        if fn is None:
            return
        try:
            fn(ev)
        except Exception as e:
            n = self.errors[kind] = self.errors.get(kind, 0) + 1
            if n <= 3:
                seq = getattr(ev, "seq", None)
                msg = (f"{self.label}: {kind}{f' (call #{seq})' if seq is not None else ''} raised "
                       f"{type(e).__name__}: {e}; replay continues")
                self.warn(msg)
                try:
                    self.stream.write(f"cudasnap: {msg}\n")
                except Exception:
                    pass
