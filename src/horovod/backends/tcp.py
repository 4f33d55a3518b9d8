"""The socket data plane: ranks on different hosts (or any ranks, when forced).

Large buffers use the bandwidth-optimal ring (reduce-scatter, then allgather: each rank sends 2(n-1)/n of the
buffer); small ones use a single round of direct exchange, which is latency-optimal for the group sizes
data-parallel jobs have. Every element is reduced in one fixed rank order, so all ranks get bitwise-identical
results.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.backends.base import Backend
from horovod.backends.blocks import offsets, split_counts
from horovod.backends.comm import Comm, as_bytes
from horovod.backends.reduce import reduce_into
from horovod.common import config
from horovod.common.types import ReduceOp


class TcpBackend(Backend):
    """Collectives over a :class:`Comm` of connected sockets."""

    name = "tcp"

    def __init__(self, comm: Comm) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.small_bytes = config.get("HOROVOD_TCP_SMALL_BYTES")
        self._scratch = np.empty(0, np.uint8)

    def _tmp(self, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:nbytes].view(dtype)

    # ------------------------------------------------------------------ allreduce
    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        if self.size == 1:
            return
        if buf.nbytes <= self.small_bytes:
            self._direct_allreduce(buf, op)
            return
        counts = split_counts(buf.size, self.size)
        self._ring_reduce_scatter(buf, counts, op)
        self._ring_allgather(buf, counts)

    def _direct_allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        n, size, rank = buf.size, self.size, self.rank
        parts = self._tmp(n * size, buf.dtype).reshape(size, n)
        parts[rank] = buf
        mine = as_bytes(buf)
        for k in range(1, size):
            self.comm.sendrecv((rank + k) % size, mine, (rank - k) % size, as_bytes(parts[(rank - k) % size]))
        np.copyto(buf, parts[0])
        for r in range(1, size):
            reduce_into(buf, parts[r], op)

    def _ring_reduce_scatter(self, buf: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        """After this, block ``rank`` of ``buf`` holds the reduction of every rank's block ``rank``."""
        size, rank = self.size, self.rank
        starts = offsets(counts)
        tmp = self._tmp(max(counts), buf.dtype)
        right, left = (rank + 1) % size, (rank - 1) % size
        for step in range(size - 1):
            send = (rank - step - 1) % size
            recv = (rank - step - 2) % size
            incoming = tmp[: counts[recv]]
            self.comm.sendrecv(right, as_bytes(buf[starts[send]:starts[send] + counts[send]]),
                               left, as_bytes(incoming))
            reduce_into(buf[starts[recv]:starts[recv] + counts[recv]], incoming, op)

    def _ring_allgather(self, buf: np.ndarray, counts: Sequence[int]) -> None:
        """Each rank starts with its block ``rank`` of ``buf`` and ends with all blocks."""
        size, rank = self.size, self.rank
        starts = offsets(counts)
        right, left = (rank + 1) % size, (rank - 1) % size
        for step in range(size - 1):
            send = (rank - step) % size
            recv = (rank - step - 1) % size
            self.comm.sendrecv(right, as_bytes(buf[starts[send]:starts[send] + counts[send]]),
                               left, as_bytes(buf[starts[recv]:starts[recv] + counts[recv]]))

    # ------------------------------------------------------------- other collectives
    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        starts = offsets(counts)
        np.copyto(out[starts[self.rank]:starts[self.rank] + counts[self.rank]], inp)
        if self.size == 1:
            return
        if out.nbytes <= self.small_bytes:
            mine = as_bytes(inp)
            for k in range(1, self.size):
                src = (self.rank - k) % self.size
                self.comm.sendrecv((self.rank + k) % self.size, mine, src,
                                   as_bytes(out[starts[src]:starts[src] + counts[src]]))
            return
        self._ring_allgather(out, counts)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """Binomial tree rooted at ``root``: ceil(log2(size)) rounds."""
        size = self.size
        if size == 1:
            return
        view = as_bytes(buf)
        vrank = (self.rank - root) % size
        mask = 1
        while mask < size:
            if vrank & mask:
                self.comm.recv_into((vrank - mask + root) % size, view)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:
            if vrank + mask < size:
                self.comm.send((vrank + mask + root) % size, view)
            mask >>= 1

    def alltoallv(self, inp: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                  recv_counts: Sequence[int], max_count: int = 0) -> None:
        sstarts, rstarts = offsets(send_counts), offsets(recv_counts)
        rank, size = self.rank, self.size
        np.copyto(out[rstarts[rank]:rstarts[rank] + recv_counts[rank]],
                  inp[sstarts[rank]:sstarts[rank] + send_counts[rank]])
        for k in range(1, size):
            dst, src = (rank + k) % size, (rank - k) % size
            self.comm.sendrecv(dst, as_bytes(inp[sstarts[dst]:sstarts[dst] + send_counts[dst]]),
                               src, as_bytes(out[rstarts[src]:rstarts[src] + recv_counts[src]]))

    def reducescatter(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        rank, size = self.rank, self.size
        starts = offsets(counts)
        if size == 1:
            np.copyto(out, inp[: counts[0]])
            return
        if inp.nbytes <= self.small_bytes:
            parts = self._tmp(counts[rank] * size, inp.dtype).reshape(size, counts[rank])
            parts[rank] = inp[starts[rank]:starts[rank] + counts[rank]]
            for k in range(1, size):
                dst, src = (rank + k) % size, (rank - k) % size
                self.comm.sendrecv(dst, as_bytes(inp[starts[dst]:starts[dst] + counts[dst]]), src,
                                   as_bytes(parts[src]))
            np.copyto(out, parts[0])
            for r in range(1, size):
                reduce_into(out, parts[r], op)
            return
        work = self.fusion_buffer(inp.size, inp.dtype)
        np.copyto(work, inp)
        self._ring_reduce_scatter(work, counts, op)
        np.copyto(out, work[starts[rank]:starts[rank] + counts[rank]])

    def barrier(self) -> None:
        self.comm.barrier()

    def close(self) -> None:
        self.comm.close()
