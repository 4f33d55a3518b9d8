"""Raw mpi4py (Open MPI) side of the collective benchmark; run under mpirun."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from benchmarks.workers.timing import OPS, SIZES, iterations, measure, resnet18_shapes, write


def main(out: str, sizes) -> None:
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = {"peer": "mpi4py", "size": n, "results": {}}
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = np.ones(count, np.float32)
        y = np.empty_like(x)
        part = np.ones(max(1, count // n), np.float32)
        gathered = np.empty(part.size * n, np.float32)
        runs = {
            "allreduce": lambda x=x, y=y: comm.Allreduce(x, y, op=MPI.SUM),
            "allgather": lambda p=part, g=gathered: comm.Allgather(p, g),
            "broadcast": lambda x=x: comm.Bcast(x, root=0),
        }
        for op in OPS:
            t = measure(runs[op], comm.Barrier, iterations(nbytes))
            rows["results"].setdefault(op, {})[str(nbytes)] = t
        if rank == 0:
            print(f"mpi4py  {nbytes:>10d} B  " + "  ".join(f"{op} {rows['results'][op][str(nbytes)] * 1e6:9.1f} us"
                                                           for op in OPS), flush=True)
    total = sum(int(np.prod(s)) for s in resnet18_shapes())
    a, b = np.ones(total, np.float32), np.empty(total, np.float32)
    rows["step_53"] = measure(lambda: comm.Allreduce(a, b, op=MPI.SUM), comm.Barrier, 10, repeats=5)
    if rank == 0:
        write(out, rows)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
