"""torch.distributed Gloo's side of the cross-host benchmark, the same allreduces; run under torchrun.

    python -m torch.distributed.run ... -m benchmarks.workers.cross_host_torch [warmup iters batches calls]
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from benchmarks.workers.cross_host_timing import BIG_BYTES, SMALL_BYTES, big_and_small, parse_args, report


def main(argv) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    big = torch.ones(BIG_BYTES // 4)
    small = torch.ones(SMALL_BYTES // 4)
    times_big, times_small = big_and_small(lambda: dist.all_reduce(big), lambda: dist.all_reduce(small),
                                           dist.barrier, args)
    if dist.get_rank() == 0:
        report("torch-gloo", dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), times_big,
               times_small)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
