"""torch.distributed (Gloo) side of the collective benchmark; run under torchrun."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from benchmarks.workers.timing import SIZES, measure, resnet18_shapes, sweep, write


def main(out: str, sizes) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    def make_runs(nbytes: int):
        count = max(1, nbytes // 4)
        x = torch.ones(count)
        part = torch.ones(max(1, count // n))
        gathered = [torch.empty_like(part) for _ in range(n)]
        return {
            "allreduce": lambda: dist.all_reduce(x),
            "allgather": lambda: dist.all_gather(gathered, part),
            "broadcast": lambda: dist.broadcast(x, 0),
        }

    rows = sweep("torch-gloo", sizes, make_runs, dist.barrier, rank, n)
    grads = [torch.ones(s) for s in resnet18_shapes()]

    def step() -> None:
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    rows["step_53"] = measure(step, dist.barrier, 10, repeats=5)
    if rank == 0:
        write(out, rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
