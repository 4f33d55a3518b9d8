"""Ranks on several hosts: shared memory inside each host, sockets (or MPI) between hosts.

Allreduce reduce-scatters through shared memory inside each host, so each local rank owns a block already
reduced across its host. It then allreduces that block over tcp with the ranks of the same local rank on the
other hosts, and allgathers the blocks back through shared memory. Only 1/local_size of the buffer crosses
the network per rank. The other collectives run over tcp on the whole group. Under MPI, the cross-host and
whole-group backends are MPI instead of tcp (any :class:`Backend` fits).
Requires every host to have the same number of ranks (the selector falls back to flat tcp otherwise).

Adasum is flat (the whole group's tree, upstream's CPU semantics) unless HOROVOD_HIERARCHICAL_ALLREDUCE=1: then
it is upstream's GPU variant, a Sum inside each host and Adasum across hosts, divided by the local size (see
:meth:`HierarchicalBackend.adasum` and docs/adasum.md).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from horovod.backends.adasum import check_dtype, gather_input, reduce_vector, scatter_output, tensor_bounds
from horovod.backends.base import Backend
from horovod.backends.blocks import split_counts
from horovod.backends.shm import ShmBackend
from horovod.common import config
from horovod.common.types import ReduceOp


class HierarchicalBackend(Backend):
    """shm inside the host + tcp (or MPI) across hosts."""

    name = "hierarchical"

    def __init__(self, flat: Backend, local: ShmBackend, cross: Backend) -> None:
        super().__init__(flat.rank, flat.size)
        self.flat, self.local, self.cross = flat, local, cross
        self._block = np.empty(0, np.uint8)
        self.hierarchical_adasum = bool(config.get("HOROVOD_HIERARCHICAL_ALLREDUCE"))

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        counts = split_counts(buf.size, self.local.size)
        nbytes = counts[self.local.rank] * buf.dtype.itemsize
        if self._block.nbytes < nbytes:
            self._block = np.empty(nbytes, np.uint8)
        block = self._block[:nbytes].view(buf.dtype)
        self.local.reducescatter(buf, block, counts, op)
        self.cross.allreduce_buffer(block, op)
        self.local.allgatherv(block, buf, counts)

    def adasum(self, inputs: List[np.ndarray], outputs: List[np.ndarray], prescale: float = 1.0,
               postscale: float = 1.0) -> None:
        """Adasum over every rank (flat), or, with HOROVOD_HIERARCHICAL_ALLREDUCE=1, across hosts of host sums.

        The hierarchical variant sums inside the host (a reduce-scatter), so each local rank owns one block of
        its host's sum; the ranks of one local rank run the Gram algorithm across hosts on their block, with
        the Gram partials summed over all ranks so that each tensor's dot products cover the whole tensor; an
        allgather inside the host assembles the result, divided by the local size (Adasum of the host
        averages: upstream's GPU path divides its postscale by local_size the same way).
        """
        if not self.hierarchical_adasum:
            self.flat.adasum(inputs, outputs, prescale, postscale)
            return
        check_dtype(inputs[0].dtype)
        vec = gather_input(self, inputs, prescale)
        local = self.local
        counts = split_counts(vec.size, local.size)
        block = self.scratch("adasum.block", counts[local.rank], vec.dtype)
        local.reducescatter(vec, block, counts, ReduceOp.SUM)
        reduce_vector(self.cross, self.flat, block, block, tensor_bounds(inputs), sum(counts[:local.rank]),
                      postscale / local.size, self.scratch)
        out = outputs[0] if len(outputs) == 1 else vec
        local.allgatherv(block, out, counts)
        scatter_output(out, outputs)

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
