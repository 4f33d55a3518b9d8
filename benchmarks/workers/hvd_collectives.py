"""Horovod (this project) side of the collective benchmark; run under horovodrun."""
from __future__ import annotations

import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.timing import (
    OPS,
    SIZES,
    iterations,
    measure,
    resnet18_shapes,
    sweep,
    time_step,
    write,
)
from horovod.bench.peers import HorovodPeer
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


def main(out: str, sizes, adasum: bool = False) -> None:
    peer = HorovodPeer()             # horovod.bench's calls: the same ones `python -m horovod.bench` times
    n, rank = peer.size, peer.rank

    rows = sweep("horovod", sizes, lambda nbytes: {op: peer.runs(op, nbytes) for op in OPS}, peer.barrier, rank,
                 n, agree=peer.agree)
    barrier = peer.barrier
    # ResNet-18-sized step: 53 async allreduces, then synchronize all.
    grads = [np.ones(s, np.float32) for s in resnet18_shapes()]
    outs = [np.empty_like(g) for g in grads]

    def step() -> None:
        handles = [ops.allreduce_async(g, o, name=f"step.{i}", op=hvd.Average) for i, (g, o) in
                   enumerate(zip(grads, outs))]
        for h in handles:
            h.wait()

    step_s = time_step(step, barrier, peer.agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if adasum:
        rows["adasum"] = adasum_vs_sum(barrier)
    if rank == 0:
        write(out, rows)
    peer.close()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES,
         adasum="--adasum" in sys.argv[3:])
