"""torch.distributed (Gloo) side of the collective benchmark; run under torchrun."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from benchmarks.workers.timing import OPS, SIZES, iterations, measure, resnet18_shapes, write


def main(out: str, sizes) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = {"peer": "torch-gloo", "size": n, "results": {}}
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = torch.ones(count)
        part = torch.ones(max(1, count // n))
        gathered = [torch.empty_like(part) for _ in range(n)]
        runs = {
            "allreduce": lambda x=x: dist.all_reduce(x),
            "allgather": lambda g=gathered, p=part: dist.all_gather(g, p),
            "broadcast": lambda x=x: dist.broadcast(x, 0),
        }
        for op in OPS:
            t = measure(runs[op], dist.barrier, iterations(nbytes))
            rows["results"].setdefault(op, {})[str(nbytes)] = t
        if rank == 0:
            print(f"gloo    {nbytes:>10d} B  " + "  ".join(f"{op} {rows['results'][op][str(nbytes)] * 1e6:9.1f} us"
                                                           for op in OPS), flush=True)
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
