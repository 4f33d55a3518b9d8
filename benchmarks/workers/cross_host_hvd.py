"""This project's side of the cross-host benchmark: 64 MB and 4 KB float32 allreduces; run under horovodrun.

    python -m benchmarks.workers.cross_host_hvd [warmup iters small_batches small_calls]
"""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.cross_host_timing import BIG_BYTES, SMALL_BYTES, big_and_small, parse_args, report
from horovod.core import ops


def main(argv) -> None:
    args = parse_args(argv)
    hvd.init()
    big = np.ones(BIG_BYTES // 4, np.float32)
    big_out = np.empty_like(big)
    small = np.ones(SMALL_BYTES // 4, np.float32)
    small_out = np.empty_like(small)
    times_big, times_small = big_and_small(
        lambda: ops.allreduce_async(big, big_out, name="xh.big", op=hvd.Sum).wait(),
        lambda: ops.allreduce_async(small, small_out, name="xh.small", op=hvd.Sum).wait(), hvd.barrier, args)
    if hvd.rank() == 0:
        report("horovod", hvd.size(), hvd.local_size(), times_big, times_small)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
