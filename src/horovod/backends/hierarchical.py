"""Ranks on several hosts: shared memory inside each host, sockets (or MPI) between hosts.

Allreduce sums inside each host through shared memory, across hosts over tcp, and spreads the result inside the
host again; which ranks cross hosts is ``HOROVOD_HIERARCHICAL_CROSS``:

- ``leader`` (the default): every local rank gets the host's sum (a shared-memory allreduce), the host's local
  rank 0 allreduces it with the other hosts' leaders, and broadcasts the result inside the host. Each link
  carries one flow. On 1 Gbit/s links, 4 hosts x 2 ranks, this reached 89.7 % of the link (median) against
  84.5 % for ``all``, whose two flows per link share it unevenly (docs/benchmarks.md).
- ``all`` (upstream's scheme): a reduce-scatter inside the host gives each local rank a block of the host's
  sum; each allreduces its block with the same local rank of the other hosts (1/local_size of the buffer per
  rank, local_size flows per link), and an allgather inside the host assembles the result. Where one stream
  cannot fill a link (fast links, busy cores) the parallel flows can do more.

Large buffers go through in pieces, the phases overlapped (the link carries one piece while the next is reduced
inside the host). With one rank per host, the cross-host allreduce runs alone.
The other collectives run over tcp on the whole group. Under MPI, the cross-host and whole-group backends are
MPI instead of tcp (any :class:`Backend` fits).
Requires every host to have the same number of ranks (the selector falls back to flat tcp otherwise).

Adasum is flat (the whole group's tree, upstream's CPU semantics) unless HOROVOD_HIERARCHICAL_ALLREDUCE=1: then
it is upstream's GPU variant, a Sum inside each host and Adasum across hosts, divided by the local size (see
:meth:`HierarchicalBackend.adasum` and docs/adasum.md).
"""
from __future__ import annotations

import queue
from concurrent.futures import Future
from typing import Callable, List, Optional, Sequence

import numpy as np

from horovod.backends import peer_waits
from horovod.backends.adasum import (
    check_dtype,
    gather_input,
    plane_adasum,
    reduce_vector,
    scatter_output,
    tensor_bounds,
)
from horovod.backends.base import Backend
from horovod.backends.blocks import split_counts
from horovod.backends.shm import ShmBackend
from horovod.common import config
from horovod.common.types import ReduceOp

# An allreduce of at least two pieces runs its phases overlapped (HierarchicalBackend._pipelined): a piece is
# large enough that its cross-host ring keeps the link busy, small enough that the link waits little for the
# first piece's reduce-scatter. Chosen by measurement (docs/benchmarks.md, "Across hosts at 1 Gbit/s").
PIECE_BYTES = 8 << 20


def piece_elements(buf: np.ndarray) -> int:
    """Elements per piece of a pipelined allreduce of ``buf``: PIECE_BYTES, or all of a smaller ``buf``."""
    if buf.nbytes < 2 * PIECE_BYTES:
        return max(buf.size, 1)
    return PIECE_BYTES // buf.dtype.itemsize


def pieces_of(buf: np.ndarray) -> List[np.ndarray]:
    """``buf`` cut into the pieces of a pipelined allreduce (views, :func:`piece_elements` each)."""
    step = piece_elements(buf)
    return [buf[lo:lo + step] for lo in range(0, buf.size, step)]


class _SerialWorker:
    """One daemon thread that runs submitted calls in order (a daemon, so that a call stuck on a lost peer
    cannot hold the process at exit), for the thread that made it (its waits are reported as that thread's)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        peer_waits.start_helper(self._run_queued, "horovod-cross-host")

    def submit(self, fn: Callable[..., None], *args) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _run_queued(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            try:
                fn(*args)
                future.set_result(None)
            except BaseException as exc:  # handed to the caller through the future
                future.set_exception(exc)

    def close(self) -> None:
        self._queue.put(None)


class HierarchicalBackend(Backend):
    """shm inside the host + tcp (or MPI) across hosts."""

    name = "hierarchical"

    def __init__(self, flat: Backend, local: ShmBackend, cross: Backend) -> None:
        super().__init__(flat.rank, flat.size)
        self.flat, self.local, self.cross = flat, local, cross
        self._block = np.empty(0, np.uint8)
        self._cross_worker: Optional[_SerialWorker] = None
        self.hierarchical_adasum = bool(config.get("HOROVOD_HIERARCHICAL_ALLREDUCE"))
        self.leader_crosses = config.get("HOROVOD_HIERARCHICAL_CROSS") == "leader"

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        if self.local.size == 1:  # one rank per host: the cross-host ring alone, no copies through shm
            self.cross.allreduce_buffer(buf, op)
            return
        if self.leader_crosses:
            self._leader_allreduce(buf, op)
            return
        pieces = pieces_of(buf)
        counts = [split_counts(piece.size, self.local.size) for piece in pieces]
        sizes = [c[self.local.rank] for c in counts]
        nbytes = sum(sizes) * buf.dtype.itemsize
        if self._block.nbytes < nbytes:
            self._block = np.empty(nbytes, np.uint8)
        flat = self._block[:nbytes].view(buf.dtype)
        blocks = [flat[lo:lo + k] for lo, k in zip(np.cumsum([0] + sizes[:-1]), sizes)]
        if len(pieces) == 1:
            self.local.reducescatter(buf, blocks[0], counts[0], op)
            self.cross.allreduce_buffer(blocks[0], op)
            self.local.allgatherv(blocks[0], buf, counts[0])
            return
        self._pipelined(pieces, blocks, counts, op)

    def _leader_allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        """``HOROVOD_HIERARCHICAL_CROSS=leader``, piece by piece: every local rank sums the piece inside the host;
        the leader hands it to the cross-host worker (in piece order on every leader) and goes on to the next
        piece; then each piece is broadcast from the leader inside the host once its ring is done. The other
        local ranks wait in that broadcast, off the link. One piece runs on this thread alone."""
        pieces = pieces_of(buf)
        leader = self.local.rank == 0
        if len(pieces) == 1:
            self.local.allreduce_buffer(buf, op)
            if leader:
                self.cross.allreduce_buffer(buf, op)
            self.local.broadcast(buf, 0)
            return
        if leader and self._cross_worker is None:
            self._cross_worker = _SerialWorker()
        done = []
        for piece in pieces:
            self.local.allreduce_buffer(piece, op)
            if leader:
                done.append(self._cross_worker.submit(self.cross.allreduce_buffer, piece, op))
        for i, piece in enumerate(pieces):
            if leader:
                done[i].result()
            self.local.broadcast(piece, 0)

    def _pipelined(self, pieces: List[np.ndarray], blocks: List[np.ndarray], counts: List[List[int]],
                   op: ReduceOp) -> None:
        """The three phases overlapped piece by piece: while the cross-host ring runs on one piece's block (on
        a worker thread, in piece order on every rank), this thread reduce-scatters the next pieces inside the
        host, then allgathers each piece as soon as its ring is done. The link idles only during the first
        piece's reduce-scatter and the last piece's allgather."""
        if self._cross_worker is None:
            self._cross_worker = _SerialWorker()
        done = []
        for piece, block, c in zip(pieces, blocks, counts):
            self.local.reducescatter(piece, block, c, op)
            done.append(self._cross_worker.submit(self.cross.allreduce_buffer, block, op))
        for piece, block, c, future in zip(pieces, blocks, counts, done):
            future.result()
            self.local.allgatherv(block, piece, c)

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
            plane_adasum(self.flat, inputs, outputs, prescale, postscale)
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
        if self._cross_worker is not None:
            self._cross_worker.close()
        self.local.close()
        self.flat.close()
