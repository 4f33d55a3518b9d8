"""Worker: training-like steps with HOROVOD_AUTOTUNE on (small sample counts from the test), checking every
result, until rank 0's autotuner is done; then prints ``TUNED <threshold> <cycle ms> <cache on>`` per rank."""
import numpy as np

import horovod.numpy as hvd
from horovod.core import basics
from horovod.core.observers.tuning import tuning

hvd.init()
engine = basics.engine()
rank, size = hvd.rank(), hvd.size()
flag = np.zeros(1, np.int32)
for step in range(2000):
    handles = [hvd.allreduce_async(np.full(1000 * (i + 1), rank + step, np.float32), name=f"g{i}", op=hvd.Sum)
               for i in range(6)]
    expected = sum(range(size)) + size * step
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        assert out.shape == (1000 * (i + 1),) and np.all(out == expected), (step, i, out[:3], expected)
    gathered = hvd.allgather(np.full((1, 2), rank, np.int64), name="ag")
    assert gathered[:, 0].tolist() == list(range(size))
    if step % 10 == 9:
        flag[0] = int(rank == 0 and tuning(engine) is None)
        if hvd.broadcast(flag, 0, name="done")[0]:
            break
print("TUNED", step, engine.coordinator.fusion_threshold if rank == 0 else -1, engine.cycle_s * 1000,
      int(engine.cache.enabled), flush=True)
hvd.shutdown()
