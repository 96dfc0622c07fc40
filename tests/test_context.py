"""Handlers see a narrow ReplayContext (replay/context.py), not the Replayer: one declared map
per handle kind, declared state fields (nothing stored ad hoc), the engine's hooks."""
from __future__ import annotations

import struct

import pytest

from cudasnap.replay import dispatch
from cudasnap.replay.context import EngineHooks, Handles, ReplayContext
from cudasnap.replay.engine import Replayer
from synth import Synth
from test_replay_graph import A, FILL, _prologue, _run


def _graph_snapshot(p):
    s = Synth(p)
    _prologue(s)
    s.call("cuGraphCreate", {"phGraph": 0x6000, "flags": 0})
    s.call("cuGraphConditionalHandleCreate", {"pHandle_out": 0xABC00000, "hGraph": 0x6000, "ctx": 0x111,
                                              "defaultLaunchValue": 1, "flags": 1})
    s.call("cuStreamBeginCapture_v2", {"hStream": 0x5000, "mode": 2})
    s.launch(FILL, struct.pack("<QIi", A, 7, 16), stream=0x5000)
    s.call("cuStreamEndCapture", {"hStream": 0x5000, "phGraph": 0x6001})
    s.call("cuGraphInstantiateWithFlags", {"phGraphExec": 0x7000, "hGraph": 0x6001, "flags": 0})
    s.call("cuGraphLaunch", {"hGraph": 0x7000, "hStream": 0x5000})
    s.call("cuStreamSynchronize", {"hStream": 0x5000})
    s.close()


def test_handlers_receive_the_context_not_the_replayer(tmp_path, monkeypatch):
    p = tmp_path / "g.cusnap"
    _graph_snapshot(p)
    seen = []
    table = dict(dispatch.table())
    for name, h in table.items():
        def spy(rp, rec, _fn=h.fn):
            seen.append(type(rp))
            return _fn(rp, rec)
        table[name] = h._replace(fn=spy)
    monkeypatch.setattr(dispatch, "_table", table)
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    assert seen and set(seen) == {ReplayContext}
    assert isinstance(rp.ctx, ReplayContext)


def test_each_piece_of_replay_state_has_one_name(tmp_path):
    """The context's fields and methods are reached through it: the Replayer re-exposes none."""
    p = tmp_path / "g.cusnap"
    _graph_snapshot(p)
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    names = set(ReplayContext.__slots__) | {n for n in vars(ReplayContext) if not n.startswith("__")}
    names -= set(EngineHooks.__slots__)            # the engine implements these; the context calls them
    both = sorted(n for n in names if hasattr(rp, n) and n != "ctx")
    assert both == [], f"Replayer re-exposes context state: {both}"


def test_one_map_per_handle_kind(tmp_path):
    p = tmp_path / "g.cusnap"
    _graph_snapshot(p)
    res, rp = _run(p)
    assert res.exit_code == 0, res.errors
    h = rp.ctx.handles
    assert set(h.contexts) == {0x111} and set(h.modules) == {0x222} and FILL in h.functions
    assert set(h.streams) == {0x5000} and set(h.graphs) == {0x6000, 0x6001} and set(h.graph_execs) == {0x7000}
    assert set(h.conditionals) == {0xABC00000}
    assert h.kind_of(0x7000) == "graph_execs" and h[0x7000] is h.graph_execs[0x7000]
    assert rp.ctx.modules is h.modules


def test_handles_one_kind_at_a_time_and_lookup_by_value():
    h = Handles()
    h.set("stream", 0x10, "s")
    assert h.lookup("stream", 0x10) == "s" and h.lookup("function", 0x10) == "s"   # a handle used as another kind
    h.set("event", 0x10, "e")                      # the value was reused for an event
    assert 0x10 not in h.streams and h.events[0x10] == "e" and h[0x10] == "e"
    assert h.pop(0x10) == "e" and 0x10 not in h and not h.events
    with pytest.raises(KeyError):
        h.lookup("event", 0x10)


def test_context_state_is_declared():
    ctx = Replayer("none.cusnap").ctx
    with pytest.raises(AttributeError):
        ctx.some_new_state = 1                     # handlers keep state in declared fields only
    ctx.note_once("k", "first")
    ctx.note_once("k", "second")
    assert ctx.res.warnings == ["first"]
