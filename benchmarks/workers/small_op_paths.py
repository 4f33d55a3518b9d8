"""A 4 KB float32 allreduce timed alone through three call paths (issue 15); run under ``horovodrun -np 2``.

``ops.allreduce_async(x, out).wait()`` (what benchmarks/collectives.py times), ``horovod.numpy.allreduce`` and
``horovod.torch.allreduce``: 300 warm-up calls, then ``n`` timed calls each (argv[1], default 3000); rank 0
prints p10 / p50 / p90 / p99 in µs per path. Used for the before/after table of the "waiting thread drives"
change in docs/benchmarks.md: run it alternately against two checkouts with PYTHONPATH=<checkout>/src.
"""
import sys
import time
from typing import Callable, List

import numpy as np
import torch

import horovod.numpy as hvd
import horovod.torch as hvd_torch
from horovod.core import ops


def percentiles(fn: Callable[[], object], n: int) -> List[float]:
    """p10 / p50 / p90 / p99 of ``n`` calls of ``fn`` in µs, after 300 warm-up calls."""
    for _ in range(300):
        fn()
    times = np.empty(n)
    for i in range(n):
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    return [round(float(np.percentile(times * 1e6, p)), 1) for p in (10, 50, 90, 99)]


def main() -> None:
    hvd.init()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    x = np.ones(1024, np.float32)
    out = np.empty_like(x)
    t = torch.ones(1024)
    paths = {
        "ops.wait": percentiles(lambda: ops.allreduce_async(x, out, name="lat").wait(), n),
        "numpy": percentiles(lambda: hvd.allreduce(x, name="lat2"), n),
        "torch": percentiles(lambda: hvd_torch.allreduce(t, name="lat3"), n),
    }
    if hvd.rank() == 0:
        print(" ".join(f"{name} {values}" for name, values in paths.items()), flush=True)


if __name__ == "__main__":
    main()
