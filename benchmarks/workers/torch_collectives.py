"""torch.distributed (Gloo) side of the collective benchmark; run under torchrun."""
from __future__ import annotations

import sys
from typing import List

import torch
import torch.distributed as dist

from benchmarks.workers.timing import SIZES, resnet18_shapes, sweep, time_step, write


def agree(vals: List[int]) -> List[int]:
    """Rank 0's ``vals`` on every rank (a Gloo broadcast)."""
    t = torch.tensor(vals, dtype=torch.int64)
    dist.broadcast(t, 0)
    return [int(v) for v in t.tolist()]


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

    rows = sweep("torch-gloo", sizes, make_runs, dist.barrier, rank, n, agree=agree)
    grads = [torch.ones(s) for s in resnet18_shapes()]

    def step() -> None:
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    step_s = time_step(step, dist.barrier, agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if rank == 0:
        write(out, rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
