"""Worker: one rank (argv[1]) sets an environment variable (argv[2]=argv[3]) that every rank must have alike, then
every rank starts Horovod and prints what it raised (or that it started)."""
import os
import sys

if os.environ.get("HOROVOD_RANK") == sys.argv[1]:
    os.environ[sys.argv[2]] = sys.argv[3]

import horovod.numpy as hvd

try:
    hvd.init()
    print("STARTED", flush=True)
    hvd.shutdown()
except ValueError as exc:
    print("ERROR", type(exc).__name__, str(exc).replace("\n", " | "), flush=True)
