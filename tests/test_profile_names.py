"""Kernel names people read in profile tables: demangled (libstdc++'s __cxa_demangle, what
c++filt uses), shortened sensibly, cut only at a terminal; JSON and CSV keep the recorded name."""
from __future__ import annotations

import io

import pytest

from cudasnap.replay import names
from cudasnap.replay.profile.report import render_table

pytestmark = pytest.mark.skipif(not names.available(), reason="libstdc++ cannot be loaded")

TORCH = ("_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_"
         "cudaERNS_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE8_clEvEUlN3c104HalfEE_EEvS4_RKT_EUliE_EEviT1_")
FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"


def test_short_names():
    assert names.demangle("_Z4fillPjji") == "fill(unsigned int*, unsigned int, int)"
    assert names.short_name("_Z4fillPjji") == "fill"
    assert names.short_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"      # extern "C" stays
    assert names.short_name(FILL) == \
        "at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<…>, std::array<…> >"
    assert names.short_name(TORCH) == \
        "at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<…>(…)::{lambda(…)#1}>"
    assert names.short_name("_ZNK3FooclEv") == "Foo::operator()"
    cut = names.short_name(TORCH, 40)
    assert len(cut) == 40 and cut.startswith("at::native::elementwise") and cut.endswith("#1}>") and "…" in cut


def _report():
    k = [{"name": TORCH, "launches": 3, "total_us": 30.0, "median_us": 10.0, "min_us": 9.0, "max_us": 11.0,
          "share_pct": 75.0},
         {"name": "_Z4fillPjji", "launches": 1, "total_us": 10.0, "median_us": 10.0, "min_us": 10.0,
          "max_us": 10.0, "share_pct": 25.0}]
    return {"summary": {"mode": "timeline", "launches_profiled": 4}, "kernels": k, "launches": []}


def test_table_off_a_terminal_never_wraps_nor_cuts():
    out = io.StringIO()
    render_table(_report(), out=out)
    lines = out.getvalue().splitlines()
    row = next(line for line in lines if "elementwise_kernel" in line)
    assert names.short_name(TORCH) in row and "30" in row          # whole short name, numbers on its line
    assert any(line.startswith("fill ") for line in lines)
    assert TORCH not in out.getvalue()                              # tables show the readable name
