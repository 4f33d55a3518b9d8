"""Worker of benchmarks/new_outputs.py: a 64 MB float32 allreduce that returns a new array against in place."""
import json
import sys
import time

import numpy as np

import horovod.numpy as hvd


def seconds(fn, iterations: int) -> float:
    for _ in range(3):
        fn()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def main() -> None:
    nbytes, iterations = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    x = np.ones(nbytes // 4, np.float32)
    new = seconds(lambda: hvd.allreduce(x, op=hvd.Sum, name="new"), iterations)
    in_place = seconds(lambda: hvd.allreduce_(x, op=hvd.Sum, name="in_place"), iterations)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"new": new, "in_place": in_place}))


if __name__ == "__main__":
    main()
