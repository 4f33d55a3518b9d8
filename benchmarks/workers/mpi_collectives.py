"""Raw mpi4py (Open MPI) side of the collective benchmark; run under mpirun."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from benchmarks.workers.timing import SIZES, resnet18_shapes, sweep, time_step, write


def raw_runs(comm, nbytes: int):
    """Raw mpi4py allreduce, allgather and broadcast of float32 buffers of ``nbytes`` (per rank)."""
    n = comm.Get_size()
    count = max(1, nbytes // 4)
    x = np.ones(count, np.float32)
    y = np.empty_like(x)
    part = np.ones(max(1, count // n), np.float32)
    gathered = np.empty(part.size * n, np.float32)
    return {
        "allreduce": lambda: comm.Allreduce(x, y, op=MPI.SUM),
        "allgather": lambda: comm.Allgather(part, gathered),
        "broadcast": lambda: comm.Bcast(x, root=0),
    }


def main(out: str, sizes) -> None:
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    def agree(vals):
        return comm.bcast(vals, root=0)

    rows = sweep("mpi4py", sizes, lambda nbytes: raw_runs(comm, nbytes), comm.Barrier, rank, n, agree=agree)
    total = sum(int(np.prod(s)) for s in resnet18_shapes())
    a, b = np.ones(total, np.float32), np.empty(total, np.float32)
    step_s = time_step(lambda: comm.Allreduce(a, b, op=MPI.SUM), comm.Barrier, agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if rank == 0:
        write(out, rows)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
