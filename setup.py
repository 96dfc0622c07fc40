# setuptools needs setup.py for cffi_modules; all metadata lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["shim/build_shim.py:ffibuilder", "replay/build_executor.py:ffibuilder",
                     "formats/build_records.py:ffibuilder", "replay/build_plan.py:ffibuilder"])
