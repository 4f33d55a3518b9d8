"""Horovod (this project) side of the collective benchmark; run under horovodrun."""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.timing import SIZES, measure, resnet18_shapes, sweep, write
from horovod.core import ops


def main(out: str, sizes) -> None:
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    def make_runs(nbytes: int):
        count = max(1, nbytes // 4)
        x = np.ones(count, np.float32)
        out_buf = np.empty_like(x)
        part = np.ones(max(1, count // n), np.float32)
        return {
            "allreduce": lambda: ops.allreduce_async(x, out_buf, name="bench.ar", op=hvd.Sum).wait(),
            "allgather": lambda: ops.allgather_async(part, name="bench.ag").wait(),
            "broadcast": lambda: ops.broadcast_async(x, 0, output=x, name="bench.bc").wait(),
        }

    rows = sweep("horovod", sizes, make_runs, hvd.barrier, rank, n)
    barrier = hvd.barrier
    # ResNet-18-sized step: 53 async allreduces, then synchronize all.
    grads = [np.ones(s, np.float32) for s in resnet18_shapes()]
    outs = [np.empty_like(g) for g in grads]

    def step() -> None:
        handles = [ops.allreduce_async(g, o, name=f"step.{i}", op=hvd.Average) for i, (g, o) in
                   enumerate(zip(grads, outs))]
        for h in handles:
            h.wait()

    rows["step_53"] = measure(step, barrier, 10, repeats=5)
    if rank == 0:
        write(out, rows)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
