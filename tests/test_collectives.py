"""Collective kernels matched across ranks: the wait for peers and the collective's own time."""
from __future__ import annotations

from cudasnap.replay.collectives import describe, from_launch_rows, is_collective, split_waits

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_the_late_rank_waits_nothing_and_the_others_wait_for_it():
    # two all-reduces: rank 1 arrives 1000 us late to the first, rank 0 300 us late to the second;
    # each collective then takes 60 us on both ranks
    us = 1000
    ranks = {0: [(AR, 0, 1060 * us), ("gemm", 5, 10), (AR, 5000 * us, 5060 * us)],
             1: [(AR, 1000 * us, 1060 * us), (AR, 4700 * us, 5060 * us)]}
    c = split_waits(ranks)
    assert c["matched"] == 2 and c["unmatched"] == 0
    r0, r1 = c["ranks"][0], c["ranks"][1]
    assert r0["n"] == r1["n"] == 2
    assert r0["collective_us"] == r1["collective_us"] == 60
    assert r0["wait_us"] == 500 and r1["wait_us"] == 150          # medians of (1000, 0) and (0, 300)
    assert r0["kernel_us"] == (1060 + 60) / 2
    lines = describe(c)
    assert lines[0].startswith("collectives: 2 matched") and "rank 1: 2 kernels" in lines[2]


def test_kernels_on_some_ranks_only_are_counted_not_matched():
    rows = {0: [{"name": AR, "start_ns": 0, "end_ns": 10}, {"name": AR, "start_ns": 20, "end_ns": 30}],
            1: [{"name": AR, "start_ns": 0, "end_ns": 10}]}
    c = from_launch_rows(rows)
    assert c["matched"] == 1 and c["unmatched"] == 1


def test_what_counts_as_a_collective():
    assert is_collective(AR) and is_collective("ncclKernel_AllGather_RING_LL_Sum_int8_t")
    assert not is_collective("ampere_sgemm_128x64_nn") and not is_collective(None)
    assert describe(split_waits({0: [("gemm", 0, 1)], 1: []})) == []


def test_mangled_names_count_too():
    assert is_collective("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE")
