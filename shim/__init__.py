"""cudasnap.shim: the driver API description (api_description.json), its generator and loader.

Kept import-free: the capture side loads this package inside instrumented processes.
"""
