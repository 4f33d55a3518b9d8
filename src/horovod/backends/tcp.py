"""The socket data plane: ranks on different hosts (or any ranks, when forced).

Allreduce chooses among four algorithms by size and rank count (:func:`tcp_schedules.choose_allreduce`, whose
module holds the schedules): for small buffers, direct exchange (every rank sends its buffer to every other) or
recursive doubling, whichever takes fewer latency steps; for middle sizes on a power of two of ranks,
Rabenseifner's recursive halving and doubling; for large ones the bandwidth-optimal ring (reduce-scatter, then
allgather: each rank sends 2(n-1)/n of the buffer). HOROVOD_TCP_ALLREDUCE_ALGORITHM forces one; the timeline
shows the one used as a nested activity (``TCP_RING``, ``TCP_DIRECT``, ``TCP_RECURSIVE_DOUBLING``,
``TCP_RABENSEIFNER``). Broadcast is a binomial tree, or for large buffers a pipelined chain (``TCP_BINOMIAL``,
``TCP_PIPELINE``; HOROVOD_TCP_BROADCAST_ALGORITHM forces one).

Every algorithm reduces each element in an order fixed by the rank count alone (the direct exchange in rank
order, the ring around the ring from the block's next rank, the recursive ones as a tree with the lower ranks'
operand on the left), and each result is either computed alike on every rank or computed once and copied, so all
ranks get bitwise-identical results; different algorithms may differ from each other in the last bits.

The ring is pipelined: each block is cut into chunks of HOROVOD_TCP_CHUNK_BYTES (1 MiB; 0: whole blocks),
and a chunk is passed on to the right neighbour (by a sender thread) as soon as it has been received and
reduced, while the caller receives the next one. The reduce-scatter's last chunk flows straight into the
allgather, so the link carries one stream from the first chunk to the last instead of 2(n-1) whole-block
exchanges with the link idle between them.
"""
from __future__ import annotations

import queue
import socket
import threading
from concurrent.futures import Future
from typing import List, Optional, Sequence

import numpy as np

from horovod.backends import peer_waits
from horovod.backends import tcp_schedules as schedules
from horovod.backends.base import Backend
from horovod.backends.blocks import offsets, split_counts
from horovod.backends.comm import Comm, as_bytes
from horovod.backends.reduce import combine, reduce_into
from horovod.common import config
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp


class _StreamSender:
    """A thread that sends queued buffers in order, so that the caller can receive and reduce meanwhile.

    :meth:`flush` returns a future that completes once everything queued before it is sent, with the first
    send's error (a :class:`PeerLostError`) if one failed; the sends queued after a failure are dropped. The
    thread is a helper of the first thread that sends (:func:`peer_waits.start_helper`): a stalled send is
    reported with that thread's collective.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def send(self, comm: Comm, peer: int, view: memoryview) -> None:
        if self._thread is None:
            self._thread = peer_waits.start_helper(self._send_queued, "horovod-ring-sender")
        self._queue.put((comm, peer, view))

    def flush(self) -> Future:
        future: Future = Future()
        if self._thread is None:
            future.set_result(None)
        else:
            self._queue.put(future)
        return future

    def _send_queued(self) -> None:
        error: Optional[BaseException] = None
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, Future):
                if error is None:
                    item.set_result(None)
                else:
                    item.set_exception(error)
                error = None
            elif error is None:
                comm, peer, view = item
                try:
                    comm.send(peer, view)
                except BaseException as exc:  # handed to the caller through flush()
                    error = exc

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None


class TcpBackend(Backend):
    """Collectives over a :class:`Comm` of connected sockets."""

    name = "tcp"

    def __init__(self, comm: Comm) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.small_bytes = config.get("HOROVOD_TCP_SMALL_BYTES")
        self.chunk_bytes = config.get("HOROVOD_TCP_CHUNK_BYTES")
        self.ring_bytes = config.get("HOROVOD_TCP_RING_BYTES")
        self.allreduce_algorithm = config.get("HOROVOD_TCP_ALLREDUCE_ALGORITHM")
        self.broadcast_algorithm = config.get("HOROVOD_TCP_BROADCAST_ALGORITHM")
        self._scratch = np.empty(0, np.uint8)
        self._stream = _StreamSender()

    def _tmp(self, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.nbytes), np.uint8)
        return self._scratch[:nbytes].view(dtype)

    # ------------------------------------------------------------------ allreduce
    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        if self.size == 1:
            return
        algorithm = schedules.choose_allreduce(self.size, buf.nbytes, self.small_bytes, self.ring_bytes,
                                               self.allreduce_algorithm)
        with activity(f"TCP_{algorithm.upper()}"):
            if algorithm == "direct":
                self._direct_allreduce(buf, op)
            elif algorithm == "recursive_doubling":
                self._run_steps(buf, schedules.recursive_doubling(self.rank, self.size, buf.size), op)
            elif algorithm == "rabenseifner":
                self._run_steps(buf, schedules.rabenseifner(self.rank, self.size, buf.size), op)
            else:
                counts = split_counts(buf.size, self.size)
                self._ring_reduce_scatter(buf, counts, op)
                self._ring_allgather(buf, counts)

    def _direct_allreduce(self, buf: np.ndarray, op: ReduceOp) -> None:
        n, size, rank = buf.size, self.size, self.rank
        parts = self._tmp(n * size, buf.dtype).reshape(size, n)
        parts[rank] = buf
        mine = as_bytes(buf)
        for dst, src in schedules.direct(rank, size):
            self.comm.sendrecv(dst, mine, src, as_bytes(parts[src]))
        np.copyto(buf, parts[0])
        for r in range(1, size):
            reduce_into(buf, parts[r], op)

    def _run_steps(self, buf: np.ndarray, steps: Sequence[schedules.Step], op: ReduceOp) -> None:
        """Run a schedule of pairwise exchanges (:class:`tcp_schedules.Step`) on ``buf`` in place."""
        for step in steps:
            (slo, shi), (rlo, rhi) = step.send, step.recv
            target = buf[rlo:rhi]
            incoming = self._tmp(rhi - rlo, buf.dtype) if step.reduce else target
            if shi > slo and rhi > rlo:
                self.comm.sendrecv(step.peer, as_bytes(buf[slo:shi]), step.peer, as_bytes(incoming))
            elif shi > slo:
                self.comm.send(step.peer, as_bytes(buf[slo:shi]))
            elif rhi > rlo:
                self.comm.recv_into(step.peer, as_bytes(incoming))
            if step.reduce and rhi > rlo:
                if step.peer_first:
                    combine(target, incoming, target, op)
                else:
                    reduce_into(target, incoming, op)

    def _ring_reduce_scatter(self, buf: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        """After this, block ``rank`` of ``buf`` holds the reduction of every rank's block ``rank``."""
        self._ring(buf, counts, op, reduce_scatter=True, allgather=False)

    def _ring_allgather(self, buf: np.ndarray, counts: Sequence[int]) -> None:
        """Each rank starts with its block ``rank`` of ``buf`` and ends with all blocks."""
        self._ring(buf, counts, None, reduce_scatter=False, allgather=True)

    def _ring(self, buf: np.ndarray, counts: Sequence[int], op: Optional[ReduceOp], reduce_scatter: bool,
              allgather: bool) -> None:
        """The ring's steps as one pipelined stream of chunks (see the module docstring).

        Step ``i`` sends the block that step ``i - 1`` received, so each received chunk, once reduced (in the
        reduce-scatter) or in place (in the allgather), is queued for the right neighbour at once. A chunk's
        memory is overwritten only after every rank has added to it, so no queued send can see a later write.
        """
        size, rank = self.size, self.rank
        steps = schedules.ring(rank, size, reduce_scatter, allgather)  # (block sent, block received, reduce it)
        starts = offsets(counts)
        chunk = max(1, self.chunk_bytes // buf.itemsize) if self.chunk_bytes > 0 else max(max(counts), 1)

        def pieces(block: int) -> List[np.ndarray]:
            end = starts[block] + counts[block]
            return [buf[lo:min(lo + chunk, end)] for lo in range(starts[block], end, chunk)]

        right, left = (rank + 1) % size, (rank - 1) % size
        tmp = self._tmp(min(chunk, max(counts)), buf.dtype)
        for part in pieces(steps[0][0]):
            self._stream.send(self.comm, right, as_bytes(part))
        try:
            for i, (_, block, reduce) in enumerate(steps):
                forward = i + 1 < len(steps)
                for part in pieces(block):
                    if reduce:
                        incoming = tmp[:part.size]
                        self.comm.recv_into(left, as_bytes(incoming))
                        reduce_into(part, incoming, op)
                    else:
                        self.comm.recv_into(left, as_bytes(part))
                    if forward:
                        self._stream.send(self.comm, right, as_bytes(part))
        except BaseException:
            self._abandon(right)
            raise
        self._stream.flush().result()

    def _abandon(self, right: int) -> None:
        """After a failed receive: end the sends too (behind a dead host they would block until TCP gives up)."""
        try:
            self.comm.socks[right].shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._stream.flush().result()
        except Exception:  # the receive's failure came first and is the one reported
            pass

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
        """A binomial tree rooted at ``root`` (ceil(log2(size)) rounds), or for large buffers a pipelined chain."""
        if self.size == 1:
            return
        algorithm = schedules.choose_broadcast(self.size, buf.nbytes, self.chunk_bytes, self.broadcast_algorithm)
        with activity(f"TCP_{algorithm.upper()}"):
            if algorithm == "pipeline":
                self._pipeline_broadcast(as_bytes(buf), root)
                return
            view = as_bytes(buf)
            parent, children = schedules.binomial_tree(self.rank, self.size, root)
            if parent is not None:
                self.comm.recv_into(parent, view)
            for child in children:
                self.comm.send(child, view)

    def _pipeline_broadcast(self, view: memoryview, root: int) -> None:
        """The chain root -> root+1 -> ...: each chunk goes on (by the sender thread) as soon as it arrives."""
        before, after = schedules.chain(self.rank, self.size, root)
        if before is None:
            self.comm.send(after, view)
            return
        chunk = self.chunk_bytes if self.chunk_bytes > 0 else max(len(view), 1)
        try:
            for lo in range(0, len(view), chunk):
                piece = view[lo:lo + chunk]
                self.comm.recv_into(before, piece)
                if after is not None:
                    self._stream.send(self.comm, after, piece)
        except BaseException:
            if after is not None:
                self._abandon(after)
            raise
        self._stream.flush().result()

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
        self._stream.close()
        self.comm.close()
