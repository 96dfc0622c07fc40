"""Capture: run a program under the interception shim and record one snapshot per process.

    ring.py      the consumer side of the shim's shared-memory ring (layout: shim/ring.h)
    decode.py    raw ring records -> schema records, through the API description
    recorder.py  drains every ring of a session into SnapshotWriters
    run.py       `cudasnap capture`: environment, child process, exit code, summary
"""
