"""Two data planes over the same ranks, each collective sent to the faster one for its size.

Under ``mpirun`` on one host, Open MPI's shared-memory collectives beat the built-in shm plane for small and
medium messages, and the built-in plane (a cache-sized pipeline that reduces straight in shared memory) beats
MPI for large ones; the crossover differs between reductions and collectives that only move data. The sizes
are the same on every rank, so every rank routes a given collective to the same plane, and the engine thread
runs them in the same order, as with a single plane.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from horovod.backends.base import Backend
from horovod.common.types import ReduceOp


class RoutedBackend(Backend):
    """``small`` for collectives up to a size, ``large`` above it (per kind: reductions, data movement)."""

    name = "routed"

    def __init__(self, small: Backend, large: Backend, reduce_max_bytes: int, move_max_bytes: int) -> None:
        super().__init__(large.rank, large.size)
        self.small, self.large = small, large
        self.reduce_max = reduce_max_bytes
        self.move_max = move_max_bytes

    def _for_reduce(self, nbytes: int) -> Backend:
        return self.small if nbytes <= self.reduce_max else self.large

    def _for_move(self, nbytes: int) -> Backend:
        return self.small if nbytes <= self.move_max else self.large

    def op_label(self, op: str, nbytes: int) -> str:
        plane = self._for_reduce(nbytes) if op in ("ALLREDUCE", "REDUCESCATTER") else self._for_move(nbytes)
        return plane.op_label(op, nbytes)

    def allreduce(self, inputs: List[np.ndarray], outputs: List[np.ndarray], op: ReduceOp,
                  prescale: float = 1.0, postscale: float = 1.0) -> None:
        nbytes = sum(a.nbytes for a in inputs)
        self._for_reduce(nbytes).allreduce(inputs, outputs, op, prescale, postscale)

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        self._for_reduce(buf.nbytes).allreduce_buffer(buf, op)

    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        self._for_move(out.nbytes).allgatherv(inp, out, counts)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self._for_move(buf.nbytes).broadcast(buf, root)

    def alltoallv(self, inp: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                  recv_counts: Sequence[int], max_count: int = 0) -> None:
        # max_count is the same on every rank (the per-rank byte totals are not).
        self._for_move(max_count * self.size * inp.dtype.itemsize).alltoallv(inp, send_counts, out, recv_counts,
                                                                            max_count)

    def reducescatter(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        self._for_reduce(inp.nbytes).reducescatter(inp, out, counts, op)

    def barrier(self) -> None:
        self.small.barrier()

    def close(self) -> None:
        self.small.close()
        self.large.close()
