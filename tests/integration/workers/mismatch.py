"""Worker: provoke one cross-rank mismatch (argv[1]: shape or root) and print what every rank sees."""
import sys

import numpy as np

import horovod.numpy as hvd

hvd.init()
rank = hvd.rank()
mode = sys.argv[1]
try:
    if mode == "shape":
        hvd.allreduce(np.ones((2 + rank, 3), np.float32), name="weights")
    elif mode == "root":
        hvd.broadcast(np.ones(4, np.float32), root_rank=rank, name="params")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("NO_ERROR", flush=True)
except RuntimeError as exc:
    print("ERROR", type(exc).__name__, str(exc).replace("\n", " | "), flush=True)
# The job carries on after the error.
out = hvd.allreduce(np.full(2, rank, np.float64), op=hvd.Sum, name="after")
print("AFTER", out.tolist(), flush=True)
hvd.shutdown()
