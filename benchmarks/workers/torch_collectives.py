"""torch.distributed (Gloo) side of the collective benchmark; run under torchrun."""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from benchmarks.workers.timing import OPS, SIZES, resnet18_shapes, sweep, time_step, write
from horovod.bench.peers import GlooPeer


def main(out: str, sizes) -> None:
    peer = GlooPeer()                # horovod.bench's calls (joined from torchrun's environment)
    rows = sweep("torch-gloo", sizes, lambda nbytes: {op: peer.runs(op, nbytes) for op in OPS}, peer.barrier,
                 peer.rank, peer.size, agree=peer.agree)
    grads = [torch.ones(s) for s in resnet18_shapes()]

    def step() -> None:
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    step_s = time_step(step, dist.barrier, peer.agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if peer.rank == 0:
        write(out, rows)
    peer.close()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
