"""The spread of timed repeats, as nvbench computes it."""
from __future__ import annotations

import math

import pytest

from cudasnap.replay.profile.isolated import stats


def test_noise_is_the_sample_standard_deviation_and_iqr_uses_inclusive_quartiles():
    d = stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert d["median_us"] == 3.0 and d["mean_us"] == 4.0 and d["min_us"] == 1.0 and d["max_us"] == 10.0
    assert d["spread_pct"] == pytest.approx(300.0)
    assert d["noise_pct"] == pytest.approx(math.sqrt(50 / 4) / 4 * 100)       # n - 1: 88.39 (pstdev: 79.06)
    assert d["iqr_pct"] == pytest.approx((4.0 - 2.0) / 3.0 * 100)            # inclusive: 66.67 (exclusive: 183.3)


def test_small_samples():
    assert stats([]) == {}
    one = stats([5.0])
    assert one["noise_pct"] == 0.0 and "iqr_pct" not in one
    assert stats([2.0, 2.0, 2.0, 2.0])["iqr_pct"] == 0.0
    assert stats([1.0, 3.0])["noise_pct"] == pytest.approx(math.sqrt(2) / 2 * 100)
