"""Worker: every rank allreduces a small tensor a few times; then rank 1 writes "<wall time> <pid>" to
``$STOP_FILE`` and stops itself with SIGSTOP *between* collectives (once its heartbeats are on the page), while
rank 0 goes on into the next allreduce, which rank 1 has not submitted: rank 0 waits in negotiation, not in the
data plane. Continued, rank 1 submits it and the job ends; every rank prints ``RESULT ok``."""
import os
import signal
import time

import numpy as np

import horovod.numpy as hvd

hvd.init()
x = np.ones(1000, np.float32)
for _ in range(20):
    hvd.allreduce(x, name="warm")
if hvd.rank() == 1:
    time.sleep(2.5)          # a heartbeat or two first (one a second)
    with open(os.environ["STOP_FILE"], "w") as f:
        f.write(f"{time.time()!r} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGSTOP)
hvd.allreduce(x, name="after.the.stop")
print("RESULT ok", flush=True)
