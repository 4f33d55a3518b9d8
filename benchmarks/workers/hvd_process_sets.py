"""Horovod side of the process-set benchmark; run under horovodrun.

``python -m benchmarks.workers.hvd_process_sets OUT MODE NBYTES``, MODE one of:
- ``alone``: every rank of the job allreduces (a 2-rank job is the baseline);
- ``sets``: the job splits into disjoint sets of 2 consecutive ranks, and every set allreduces at once;
- ``global``: every rank of the job allreduces, on the global set (the 4-rank job).
The first rank of each set (rank 0 for alone/global) writes seconds per allreduce into OUT.<rank>.json.
"""
from __future__ import annotations

import json
import sys

import numpy as np

import horovod.numpy as hvd
from benchmarks.workers.timing import iterations, measure
from horovod.core import ops


def main(out: str, mode: str, nbytes: int) -> None:
    hvd.init(process_sets="dynamic" if mode == "sets" else None)
    rank, size = hvd.rank(), hvd.size()
    ps = hvd.global_process_set
    if mode == "sets":
        sets = [hvd.add_process_set([r, r + 1]) for r in range(0, size - 1, 2)]
        ps = next(s for s in sets if s.included())
    x = np.ones(nbytes // 4, np.float32)
    buf = np.empty_like(x)

    def run() -> None:
        ops.allreduce_async(x, buf, name="bench.ps", op=hvd.Sum, process_set=ps).wait()

    def barrier() -> None:
        hvd.barrier()                   # every set starts each timed round together

    seconds = measure(run, barrier, iterations(nbytes) * 2)
    if ps.rank() == 0:
        with open(f"{out}.{rank}.json", "w") as f:
            json.dump({"mode": mode, "rank": rank, "set": ps.ranks, "bytes": nbytes, "seconds": seconds}, f)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
