"""Worker of benchmarks/allgather_fusion.py: time bursts of async allgathers (submitted together, then waited)."""
import json
import sys
import time

import numpy as np

import horovod.numpy as hvd


def main() -> None:
    count, nbytes, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    tensors = [np.full(nbytes // 4, hvd.rank(), np.float32) for _ in range(count)]

    def burst() -> None:
        handles = [hvd.allgather_async(t, name=f"burst.{i}") for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)

    for _ in range(5):
        burst()
    times = []
    for _ in range(repeats):
        hvd.barrier()
        start = time.perf_counter()
        burst()
        times.append(time.perf_counter() - start)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"median_s": float(np.median(times)), "min_s": float(np.min(times))}))


if __name__ == "__main__":
    main()
