"""Worker: rank 1 writes "<wall time> <pid>" to ``$STOP_FILE`` and stops itself with SIGSTOP before
``hvd.init()``, so before its first heartbeat (rank 0 waits for it in the rendezvous). Continued, it joins and
every rank allreduces once and prints ``RESULT ok``."""
import os
import signal
import time

import numpy as np

if os.environ.get("HOROVOD_RANK") == "1":
    with open(os.environ["STOP_FILE"], "w") as f:
        f.write(f"{time.time()!r} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGSTOP)

import horovod.numpy as hvd  # after the stop: nothing of horovod has run on rank 1 yet

hvd.init()
hvd.allreduce(np.ones(10, np.float32), name="after.the.start")
print("RESULT ok", flush=True)
