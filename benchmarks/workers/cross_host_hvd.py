"""This project's side of the cross-host benchmark: 64 MB and 4 KB float32 allreduces in place (horovodrun).

    python -m benchmarks.workers.cross_host_hvd [warmup iters small_batches small_calls]
"""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.cross_host_timing import BIG_BYTES, SMALL_BYTES, big_and_small, parse_args, report
from horovod.core import ops


def _blocking_small(small: np.ndarray) -> None:
    """The 4 KB allreduce as the bindings' blocking calls make it (``hvd.allreduce``): a small one is then reduced
    by the coordinator (core/engine/carried.py; HOROVOD_COORDINATOR_CARRY_BYTES=0 sends it through the data
    plane, as an async call goes)."""
    with ops.blocking():
        ops.allreduce_async(small, small, name="xh.small", op=hvd.Sum).wait()


def main(argv) -> None:
    args = parse_args(argv)
    hvd.init()
    big = np.ones(BIG_BYTES // 4, np.float32)
    small = np.ones(SMALL_BYTES // 4, np.float32)
    # In place, as dist.all_reduce(t) in the Gloo worker (a separate output costs one 64 MB copy more).
    times_big, times_small = big_and_small(
        lambda: ops.allreduce_async(big, big, name="xh.big", op=hvd.Sum).wait(),
        lambda: _blocking_small(small), hvd.barrier, args)
    if hvd.rank() == 0:
        report("horovod", hvd.size(), hvd.local_size(), times_big, times_small)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
