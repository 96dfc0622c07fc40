"""Graph mode's calibration: what CUPTI tracing adds per graph node."""
from cudasnap.replay.profile.gapmodel import gap_model
from cudasnap.replay.profile.graphunits import Rec


def _chain(k, dur_ns, gap_ns, t=0):
    out = []
    for _ in range(k):
        out.append(Rec(t, t + dur_ns, "cudasnap_empty"))
        t += dur_ns + gap_ns
    return out


def test_model_separates_kernel_time_and_gaps():
    k = 1000
    # traced: 1.0 us kernels with 0.6 us gaps; untraced chain 1000 x 1.0 us + 999 x 0.3 us
    traced = [_chain(k, 1000, 600), _chain(k, 1000, 600, t=10**9)]
    m = gap_model([1000 * 1.0 + 999 * 0.3], traced, k)
    assert abs(m["kernel_us"] - 1.0) < 1e-9
    assert abs(m["gap_traced_us"] - 0.6) < 1e-9
    assert abs(m["gap_untraced_us"] - 0.3) < 1e-9
    assert abs(m["tracing_per_gap_us"] - 0.3) < 1e-9
    # traced span 1000 x 1.0 + 999 x 0.6 against 1000 x 1.0 + 999 x 0.3 untraced: 0.2997 us per node
    assert abs(m["tracing_per_node_us"] - 999 * 0.3 / 1000) < 1e-9


def test_runs_with_missing_records_are_not_used():
    assert gap_model([100.0], [_chain(10, 1000, 500)[:9]], 10) is None
    assert gap_model([], [_chain(10, 1000, 500)], 10) is None
