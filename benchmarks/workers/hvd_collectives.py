"""Horovod (this project) side of the collective benchmark; run under horovodrun."""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.timing import SIZES, iterations, measure, resnet18_shapes, sweep, time_step, write
from horovod.core import ops

ADASUM_BYTES = 64 << 20


def adasum_vs_sum(barrier, nbytes: int = ADASUM_BYTES) -> dict:
    """Seconds per float32 Adasum allreduce and per Sum allreduce of ``nbytes``, alternating in one run."""
    x = np.random.default_rng(hvd.rank()).standard_normal(nbytes // 4).astype(np.float32)
    out = np.empty_like(x)
    runs = {"adasum": lambda: ops.allreduce_async(x, out, name="bench.adasum", op=hvd.Adasum).wait(),
            "sum": lambda: ops.allreduce_async(x, out, name="bench.sum", op=hvd.Sum).wait()}
    samples = {op: [] for op in runs}
    for _ in range(3):                       # alternate, so that both see the same load on the machine
        for op, run in runs.items():
            samples[op].append(measure(run, barrier, iterations(nbytes), repeats=1))
    return {"bytes": nbytes, **{op: sorted(times)[1] for op, times in samples.items()}}


def blocking_allreduce(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """A blocking Sum allreduce as ``hvd.allreduce_`` makes it (small ones may take a fast round), into ``out``."""
    with ops.blocking():
        return ops.allreduce_async(x, out, name="bench.ar", op=hvd.Sum).wait()


def main(out: str, sizes, adasum: bool = False) -> None:
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    def make_runs(nbytes: int):
        count = max(1, nbytes // 4)
        x = np.ones(count, np.float32)
        out_buf = np.empty_like(x)
        part = np.ones(max(1, count // n), np.float32)
        return {
            "allreduce": lambda: blocking_allreduce(x, out_buf),
            "allgather": lambda: ops.allgather_async(part, name="bench.ag").wait(),
            "broadcast": lambda: ops.broadcast_async(x, 0, output=x, name="bench.bc").wait(),
        }

    def agree(vals):
        return hvd.broadcast_object(vals, 0, name="bench.agree")

    rows = sweep("horovod", sizes, make_runs, hvd.barrier, rank, n, agree=agree)
    barrier = hvd.barrier
    # ResNet-18-sized step: 53 async allreduces, then synchronize all.
    grads = [np.ones(s, np.float32) for s in resnet18_shapes()]
    outs = [np.empty_like(g) for g in grads]

    def step() -> None:
        handles = [ops.allreduce_async(g, o, name=f"step.{i}", op=hvd.Average) for i, (g, o) in
                   enumerate(zip(grads, outs))]
        for h in handles:
            h.wait()

    step_s = time_step(step, barrier, agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if adasum:
        rows["adasum"] = adasum_vs_sum(barrier)
    if rank == 0:
        write(out, rows)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES,
         adasum="--adasum" in sys.argv[3:])
