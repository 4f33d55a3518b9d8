"""Worker: the other ranks submit tensor ``only.some`` at once; rank 1 sleeps argv[1] seconds first, then
submits it late (argv[2] == "late", the stall resolves) or submits another name instead ("skip"). The
tensor went through once on every rank before, so the stall concerns a tensor in the response cache.

Every rank prints ``RESULT ok`` or ``RESULT <ExceptionType> <elapsed> <message on one line>``.
"""
import sys
import time

import numpy as np

import horovod.numpy as hvd

hvd.init()
sleep, how = float(sys.argv[1]), sys.argv[2]
hvd.allreduce(np.ones(3), name="only.some")     # every rank: now the response cache knows the tensor
start = time.monotonic()
try:
    if hvd.rank() != 1:
        hvd.allreduce(np.ones(3), name="only.some")
    else:
        time.sleep(sleep)
        hvd.allreduce(np.ones(3), name="only.some" if how == "late" else "something.else")
    print("RESULT ok", flush=True)
except Exception as exc:  # what the user's program would see
    text = str(exc).replace("\n", " | ")
    print(f"RESULT {type(exc).__name__} {time.monotonic() - start:.1f} {text}", flush=True)
