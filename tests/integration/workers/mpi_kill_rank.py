"""Worker (under mpirun): rank 1 SIGKILLs itself right after a first successful allreduce; the others go on
calling allreduce. Each survivor prints ``SURVIVOR_ERROR <type> <message>`` if Horovod raises, and re-raises.
What ends the job (Horovod's error, or Open MPI killing the survivors) is up to the outer test to observe.
"""
import os
import signal
import time

import numpy as np

import horovod.numpy as hvd

hvd.init()
rank = hvd.rank()
x = np.ones(1000, np.float32)
out = hvd.allreduce(x, op=hvd.Sum, name="first")
assert np.all(out == hvd.size()), out[:3]
print("FIRST_ALLREDUCE ok", flush=True)
if rank == 1:
    print("KILLING_MYSELF", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    for i in range(100000):
        hvd.allreduce(x, op=hvd.Sum, name="loop")
        if i % 3 == 0:
            hvd.allreduce(np.ones(300_000, np.float32), op=hvd.Sum, name="big")
    raise SystemExit("rank 1 never died")
except hvd.HorovodInternalError as exc:
    print(f"SURVIVOR_ERROR after {time.monotonic() - start:.2f}s {type(exc).__name__}: "
          f"{str(exc).splitlines()[0]}", flush=True)
    raise
