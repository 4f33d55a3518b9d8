"""Worker: publish the rendezvous port, keep working until $STATE_DIR/release exists, then re-initialise
(a second rendezvous through the same server) and check a final allreduce."""
import os
import time

import numpy as np

import horovod.numpy as hvd

state = os.environ["STATE_DIR"]
hvd.init()
rank, size = hvd.rank(), hvd.size()
if rank == 0:
    with open(os.path.join(state, "port.tmp"), "w") as f:
        f.write(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    os.replace(os.path.join(state, "port.tmp"), os.path.join(state, "port"))
deadline = time.time() + 60
steps = 0
while True:
    released = np.array([os.path.exists(os.path.join(state, "release"))], np.int32)
    # Everyone leaves the loop in the same iteration: the release flag is agreed by allreduce.
    if hvd.allreduce(released, op=hvd.Max, name="release")[0]:
        break
    out = hvd.allreduce(np.full(64, rank + 1.0), op=hvd.Sum, name="work")
    assert (out == size * (size + 1) / 2).all()
    steps += 1
    assert time.time() < deadline, "never released"
    time.sleep(0.01)
hvd.shutdown()
hvd.init()                     # a new rendezvous through the server that was attacked meanwhile
out = hvd.allreduce(np.full(8, rank + 1.0), op=hvd.Sum, name="final")
assert (out == size * (size + 1) / 2).all(), out
print("RESULT ok", hvd.rank(), hvd.size(), steps, flush=True)
hvd.shutdown()
