"""Launch parameters as the driver takes them: the packed bytes behind an `extra` buffer (or a
kernelParams array when the layout is known), and the CUlaunchConfig layout. Below the handlers:
launch handlers, launch events and profilers build them."""
from __future__ import annotations

import ctypes

from cudasnap.formats.layout import packer

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
LAUNCH_CONFIG = packer("CUlaunchConfig")       # grid xyz, block xyz, shmem, hStream, attrs, numAttrs


class LaunchParams:
    """Packed parameter bytes kept alive for the duration of one launch."""

    def __init__(self, data: bytes, layout=None):
        self.data = data
        self.buf = ctypes.create_string_buffer(data, max(len(data), 1))
        self.size = ctypes.c_size_t(len(data))
        self.extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self.buf),
                                           CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self.size), CU_LAUNCH_PARAM_END)
        self.kp = None
        if layout is not None:
            base = ctypes.addressof(self.buf)
            self.kp = (ctypes.c_void_p * max(len(layout), 1))(*[base + o for o, _s in layout])

    @property
    def extra_ptr(self):
        return ctypes.addressof(self.extra) if self.data else 0   # no parameters: NULL extra

    @property
    def kp_ptr(self):
        return ctypes.addressof(self.kp) if self.kp is not None else None
