"""Horovod (this project) side of the collective benchmark; run under horovodrun."""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.timing import OPS, SIZES, iterations, measure, resnet18_shapes, write
from horovod.common import ops


def main(out: str, sizes) -> None:
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    rows = {"peer": "horovod", "size": n, "results": {}}
    barrier = hvd.barrier
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = np.ones(count, np.float32)
        out_buf = np.empty_like(x)
        part = np.ones(max(1, count // n), np.float32)
        runs = {
            "allreduce": lambda x=x, o=out_buf: ops.allreduce_async(x, o, name="bench.ar", op=hvd.Sum).wait(),
            "allgather": lambda p=part: ops.allgather_async(p, name="bench.ag").wait(),
            "broadcast": lambda x=x: ops.broadcast_async(x, 0, output=x, name="bench.bc").wait(),
        }
        for op in OPS:
            t = measure(runs[op], barrier, iterations(nbytes))
            rows["results"].setdefault(op, {})[str(nbytes)] = t
        if rank == 0:
            print(f"horovod {nbytes:>10d} B  " + "  ".join(f"{op} {rows['results'][op][str(nbytes)] * 1e6:9.1f} us"
                                                           for op in OPS), flush=True)
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
