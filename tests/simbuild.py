"""The GPGPU-Sim build the simulator tests use: the one CUDASNAP_GPGPUSIM names (.ci/run sets it
where CI has one); without it those tests skip, saying why."""
import os

import pytest


def sim_path():
    p = os.environ.get("CUDASNAP_GPGPUSIM")
    return p if p and os.path.isfile(os.path.join(p, "lib", "libcudart.so")) else None


SIM = sim_path()
needs_sim = pytest.mark.skipif(SIM is None, reason="no GPGPU-Sim build (set CUDASNAP_GPGPUSIM to one)")
