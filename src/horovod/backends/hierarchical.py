"""Ranks on several hosts: shared memory inside each host, sockets (or MPI) between hosts.

Allreduce reduce-scatters through shared memory inside each host, so each local rank owns a block already
reduced across its host. It then allreduces that block over tcp with the ranks of the same local rank on the
other hosts, and allgathers the blocks back through shared memory. Only 1/local_size of the buffer crosses
the network per rank. The other collectives run over tcp on the whole group. Under MPI, the cross-host and
whole-group backends are MPI instead of tcp (any :class:`Backend` fits).
Requires every host to have the same number of ranks (the selector falls back to flat tcp otherwise).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.backends.base import Backend
from horovod.backends.shm import ShmBackend
from horovod.backends.tcp import split_counts
from horovod.common.types import ReduceOp


class HierarchicalBackend(Backend):
    """shm inside the host + tcp (or MPI) across hosts."""

    name = "hierarchical"

    def __init__(self, flat: Backend, local: ShmBackend, cross: Backend) -> None:
        super().__init__(flat.rank, flat.size)
        self.flat, self.local, self.cross = flat, local, cross
        self._block = np.empty(0, np.uint8)

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        counts = split_counts(buf.size, self.local.size)
        nbytes = counts[self.local.rank] * buf.dtype.itemsize
        if self._block.nbytes < nbytes:
            self._block = np.empty(nbytes, np.uint8)
        block = self._block[:nbytes].view(buf.dtype)
        self.local.reducescatter(buf, block, counts, op)
        self.cross.allreduce_buffer(block, op)
        self.local.allgatherv(block, buf, counts)

    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        self.flat.allgatherv(inp, out, counts)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        self.flat.broadcast(buf, root)

    def alltoallv(self, inp, send_counts, out, recv_counts, max_count: int = 0) -> None:
        self.flat.alltoallv(inp, send_counts, out, recv_counts)

    def reducescatter(self, inp, out, counts, op) -> None:
        self.flat.reducescatter(inp, out, counts, op)

    def barrier(self) -> None:
        self.flat.barrier()

    def close(self) -> None:
        self.local.close()
        self.flat.close()
