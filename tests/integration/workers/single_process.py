"""Worker: Horovod without a launcher (run directly, with no HOROVOD_* variables in the environment)."""
import numpy as np

import horovod.numpy as hvd

for name, call in [("rank", hvd.rank), ("size", hvd.size), ("local_rank", hvd.local_rank),
                   ("allreduce", lambda: hvd.allreduce(np.ones(2)))]:
    try:
        call()
        print("BEFORE_INIT", name, "no error")
    except ValueError as exc:
        print("BEFORE_INIT", name, "ValueError", exc)
print("INITIALIZED", hvd.is_initialized())
hvd.init()
hvd.init()                     # a repeated init is a no-op
print("TOPOLOGY", hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
print("SUM", hvd.allreduce(np.arange(3.0), op=hvd.Sum).tolist())
print("GATHER", hvd.allgather(np.arange(2)).tolist(), hvd.broadcast_object({"a": 1}), hvd.join())
hvd.shutdown()
print("AFTER_SHUTDOWN", hvd.is_initialized())
try:
    hvd.rank()
except ValueError as exc:
    print("AFTER_SHUTDOWN_RANK", "ValueError", exc)
hvd.init()                     # re-init after shutdown
print("REINIT", hvd.rank(), hvd.size(), hvd.allreduce(np.ones(2), op=hvd.Sum).tolist())
hvd.shutdown()
hvd.shutdown()                 # a repeated shutdown is harmless
print("DONE")
