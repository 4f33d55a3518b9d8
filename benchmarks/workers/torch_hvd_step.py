"""horovod.torch side of the ResNet-18-sized step: 53 torch gradients (46 MB), ``allreduce_async_`` each, then
``synchronize`` all; run under horovodrun. Writes ``{"step_53": seconds}`` from rank 0."""
from __future__ import annotations

import sys

import torch

import horovod.torch as hvd
from benchmarks.workers.timing import measure, resnet18_shapes, write


def main(out: str) -> None:
    torch.set_num_threads(1)
    hvd.init()
    grads = [torch.ones(s, dtype=torch.float32) for s in resnet18_shapes()]

    def step() -> None:
        handles = [hvd.allreduce_async_(g, name=f"step.{i}", op=hvd.Average) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    rows = {"peer": "horovod.torch", "size": hvd.size(), "tensors": len(grads),
            "bytes": sum(g.numel() * 4 for g in grads), "step_53": measure(step, hvd.barrier, 10, repeats=5)}
    if hvd.rank() == 0:
        write(out, rows)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
