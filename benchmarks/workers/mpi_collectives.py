"""Raw mpi4py (Open MPI) side of the collective benchmark; run under mpirun."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from benchmarks.workers.timing import OPS, SIZES, resnet18_shapes, sweep, time_step, write
from horovod.bench.peers import Mpi4pyPeer


def main(out: str, sizes) -> None:
    peer = Mpi4pyPeer()              # horovod.bench's calls: the same ones `python -m horovod.bench` times
    comm = MPI.COMM_WORLD
    rows = sweep("mpi4py", sizes, lambda nbytes: {op: peer.runs(op, nbytes) for op in OPS}, peer.barrier,
                 peer.rank, peer.size, agree=peer.agree)
    total = sum(int(np.prod(s)) for s in resnet18_shapes())
    a, b = np.ones(total, np.float32), np.empty(total, np.float32)
    step_s = time_step(lambda: comm.Allreduce(a, b, op=MPI.SUM), comm.Barrier, peer.agree)
    if step_s is not None:
        rows["step_53"] = step_s
    if peer.rank == 0:
        write(out, rows)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else SIZES)
