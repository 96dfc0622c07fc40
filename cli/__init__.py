"""cudasnap: CUDA snapshot-and-replay.

Parts (each its own subpackage):
  cudasnap.formats  the .cusnap container, schema, blob store, recovery (imports nothing else)
  cudasnap.shim     the API description and the preloaded interception library
  cudasnap.capture  `cudasnap capture`: runs a program under the shim, records snapshots
  cudasnap.replay   `cudasnap replay`: re-executes a snapshot on a GPU through cuda-python
"""

__version__ = "0.1.0"
