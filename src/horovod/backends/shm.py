"""The shared-memory data plane: ranks on one host exchange data through one mapped segment.

Each local rank owns a slot of ``chunk`` bytes, and the segment has one more ``chunk``-byte result area.
Collectives run as a pipeline over chunks that stay cache-resident: every rank copies its piece into its
slot, applying prescale during that copy (this copy is the fusion: tensors go straight from their own memory
into shared memory, with no separate fusion buffer). A barrier follows. Each rank then reduces its own
segment of the chunk across all slots, in rank order, so every element is reduced exactly once and all
ranks see identical bits. After another barrier, every rank copies the result out, applying postscale.
Barriers are one-byte socket exchanges between local ranks, so waiting releases the GIL instead of
spinning.

Large broadcasts copy once instead of twice where the kernel allows cross-memory copies
(:mod:`horovod.backends.cma`): each rank publishes its buffer's address in a small header after the slots,
and the ranks copy straight between their buffers, with no slot in between, the root writing one part into
every peer while the peers read the rest. The ranks probe this once when the segment is made, agree, and keep
the slot path when any of them is refused. Allgather stays on the slots: it is bound by memory bandwidth, and
a single-copy read fetches every block from memory twice (once per reader) where the slot path fetches it once
and its second copy stays in cache (docs/benchmarks.md, issue 15).

The segment lives in /dev/shm and is unlinked as soon as every local rank has mapped it, so nothing is left
behind even if a rank is killed.
"""
from __future__ import annotations

import logging
import mmap
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from horovod.backends import cma
from horovod.backends.base import Backend
from horovod.backends.blocks import offsets
from horovod.backends.comm import Comm, PeerLostError
from horovod.backends.reduce import combine, reduce_into, reduce_pieces, scaled_copy
from horovod.common import config
from horovod.common.timeline import activity
from horovod.common.types import ReduceOp

log = logging.getLogger(__name__)

ALIGN = 64
SMALL_ALLREDUCE_BYTES = 256 * 1024
# From this size broadcast copies once, by cross-memory reads and writes, where the ranks may use them.
DIRECT_BROADCAST_BYTES = 1 << 20
# Allgather copies once (cross-memory reads) when its whole output lies in this window: there the blocks stay in
# the cache between their owner's write and the peers' reads. Above it the copies are bound by memory bandwidth,
# and the slot path, which fetches each input from memory once, is as fast (docs/benchmarks.md, issue 15).
DIRECT_ALLGATHER_BYTES = (4 << 20, 32 << 20)
# An allreduce of one tensor from this size reduces each rank's 1/size straight from the peers' inputs and writes
# it into their outputs (cross-memory calls), in pieces of DIRECT_PIECE_BYTES that stay in the cache, with one
# barrier at the end instead of two per chunk: each chunk's barriers wait for a peer to be scheduled
# (docs/benchmarks.md, issue 31).
DIRECT_ALLREDUCE_BYTES = 4 << 20
DIRECT_PIECE_BYTES = 2 << 20
# One 64-byte record per rank after the slots: [pid, buffer address, buffer bytes, output address, probe verdict,
# probe token x2]
RECORD_WORDS = 8
PID, ADDRESS, NBYTES, OUT_ADDRESS, VERDICT, TOKEN = 0, 1, 2, 3, 4, 5
# After the records, the area of the engine's fast rounds (horovod/core/engine/fast_rounds.py): one shared line,
# then per rank a header of FAST_HEADER_BYTES and two data slots of FAST_SLOT_BYTES.
FAST_LINE_BYTES = 64
FAST_HEADER_BYTES = 512
FAST_SLOT_BYTES = 1024 * 1024


def fast_area_bytes(size: int) -> int:
    """The bytes of the fast rounds' area for ``size`` ranks: the shared line, then each rank's header and two
    slots."""
    return FAST_LINE_BYTES + size * (FAST_HEADER_BYTES + 2 * FAST_SLOT_BYTES)


def _align_down(n: int, unit: int) -> int:
    return max(unit, n - n % unit)


class ShmSegment:
    """One shared mapping for the ranks of a :class:`Comm` that all live on this host."""

    def __init__(self, comm: Comm, tag: str, chunk_bytes: int) -> None:
        self.comm = comm
        self.chunk = _align_down(chunk_bytes, ALIGN * max(1, comm.size))
        self.records_end = self.chunk * (comm.size + 1) + RECORD_WORDS * 8 * comm.size
        self.nbytes = self.records_end + fast_area_bytes(comm.size)
        path = f"/dev/shm/horovod-{tag}"
        if comm.rank == 0:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, self.nbytes)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
        comm.barrier()
        if comm.rank != 0:
            fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, self.nbytes)
        finally:
            os.close(fd)
        comm.barrier()
        if comm.rank == 0:
            os.unlink(path)
        self.raw = np.frombuffer(self._map, np.uint8)

    def slot(self, rank: int, dtype) -> np.ndarray:
        return self.raw[rank * self.chunk:(rank + 1) * self.chunk].view(dtype)

    def result(self, dtype) -> np.ndarray:
        return self.raw[self.comm.size * self.chunk:(self.comm.size + 1) * self.chunk].view(dtype)

    def record(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s header record (uint64 words, see ``RECORD_WORDS``)."""
        start = (self.comm.size + 1) * self.chunk + rank * RECORD_WORDS * 8
        return self.raw[start:start + RECORD_WORDS * 8].view(np.uint64)

    def fast_area(self) -> np.ndarray:
        """The bytes of the engine's fast rounds (zeroed when the segment is made)."""
        return self.raw[self.records_end:]

    def close(self) -> None:
        self.raw = None
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still referenced; the mapping goes with the process


def _segment(n: int, parts: int, index: int, itemsize: int):
    """[lo, hi) of block ``index`` when ``n`` elements split into ``parts`` cache-line aligned blocks."""
    unit = max(1, ALIGN // itemsize)
    per = -(-n // parts)
    per = -(-per // unit) * unit
    lo = min(n, index * per)
    return lo, min(n, lo + per)


def _pieces(arrays: List[np.ndarray], start: int, count: int):
    """(array slice, offset) for each piece of elements [start, start+count) of the arrays' concatenation."""
    pos, done = 0, 0
    for a in arrays:
        end = pos + a.size
        if end > start and done < count:
            lo = max(start, pos) - pos
            take = min(a.size - lo, count - done)
            yield a[lo:lo + take], done
            done += take
        pos = end
        if done >= count:
            return


def _copy_from_list(arrays: List[np.ndarray], start: int, dst: np.ndarray, factor: float) -> None:
    """Fill ``dst`` with elements [start, start+len(dst)) of the concatenation of ``arrays``."""
    for piece, offset in _pieces(arrays, start, dst.size):
        scaled_copy(dst[offset:offset + piece.size], piece, factor)


def _copy_to_list(src: np.ndarray, arrays: List[np.ndarray], start: int, factor: float) -> None:
    """Write ``src`` into elements [start, start+len(src)) of the concatenation of ``arrays``."""
    for piece, offset in _pieces(arrays, start, src.size):
        scaled_copy(piece, src[offset:offset + piece.size], factor)


class ShmBackend(Backend):
    """Collectives for ranks that share a host."""

    name = "shm"

    def __init__(self, comm: Comm, tag: str, chunk_bytes: int) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.seg = ShmSegment(comm, tag, chunk_bytes)
        # Below this many bytes (all ranks' data together) allreduce takes the one-barrier path.
        self.small_bytes = min(SMALL_ALLREDUCE_BYTES, self.seg.chunk // 2)
        self._flip = 0
        # After a one-barrier (small) op, peers may still be reading slots: the next op that writes anywhere
        # but the other half must first wait for them (every rank runs the same op sequence, so the flag
        # agrees across ranks).
        self._readers_pending = False
        refused = self._agree_on_cross_memory()
        self.direct = refused is None
        if self.direct:
            log.debug("shm: broadcasts from %d bytes copy once, by cross-memory reads and writes "
                      "(process_vm_readv/writev)", DIRECT_BROADCAST_BYTES)
        else:
            log.debug("shm: broadcasts copy through the shared slots: %s", refused)

    def _agree_on_cross_memory(self) -> Optional[str]:
        """Whether every local rank may read every other's memory (None), else why not; collective.

        Each rank publishes its pid and the address of 16 random bytes, reads each peer's bytes and compares
        them with the copy in the peer's record, then all ranks share their verdicts, so that they all choose
        the same path.
        """
        if self.size == 1:
            return "a single local rank"
        mine = self.seg.record(self.rank)
        token = np.frombuffer(os.urandom(16), np.uint8).copy()
        mine[PID], mine[ADDRESS] = os.getpid(), cma.address(token)
        mine[TOKEN:TOKEN + 2] = token.view(np.uint64)
        self.comm.barrier()
        why = None
        if not config.get("HOROVOD_SHM_CROSS_MEMORY"):
            why = "HOROVOD_SHM_CROSS_MEMORY=0"
        for r in range(self.size):
            if why is None and r != self.rank:
                peer = self.seg.record(r)
                why = cma.probe(int(peer[PID]), int(peer[ADDRESS]), peer[TOKEN:TOKEN + 2].tobytes())
        mine[VERDICT] = 0 if why is None else 1
        self.comm.barrier()                           # the peers have read ``token``: it may go
        refused = [r for r in range(self.size) if self.seg.record(r)[VERDICT]]
        if not refused:
            return None
        return why or f"local rank {refused[0]} may not read its peers' memory (see its debug log)"

    def _small_half(self, dtype) -> int:
        """Element offset of the slot half this one-barrier op uses (alternates between calls)."""
        base = (self._flip * (self.seg.chunk // 2)) // np.dtype(dtype).itemsize
        self._flip ^= 1
        self._readers_pending = True
        return base

    def _settle(self) -> None:
        """Before an op that may overwrite any part of a slot: wait for readers of the last small op."""
        if self._readers_pending:
            self._readers_pending = False
            self.comm.barrier()

    def _reduce_segment(self, lo: int, hi: int, dtype, op: ReduceOp, dst: np.ndarray) -> None:
        seg = self.seg
        if self.size == 1:
            np.copyto(dst, seg.slot(0, dtype)[lo:hi])
            return
        combine(dst, seg.slot(0, dtype)[lo:hi], seg.slot(1, dtype)[lo:hi], op)
        for r in range(2, self.size):
            reduce_into(dst, seg.slot(r, dtype)[lo:hi], op)

    # ------------------------------------------------------------------ allreduce
    def allreduce(self, inputs: List[np.ndarray], outputs: List[np.ndarray], op: ReduceOp,
                  prescale: float = 1.0, postscale: float = 1.0) -> None:
        dtype = inputs[0].dtype
        total = sum(a.size for a in inputs)
        if total * dtype.itemsize * self.size <= self.small_bytes:
            self._small_allreduce(inputs, outputs, total, dtype, op, prescale, postscale)
            return
        if self.direct and len(inputs) == 1 and total * dtype.itemsize >= DIRECT_ALLREDUCE_BYTES:
            # Decided on what every rank shares (a rank's own layout would let ranks choose differently).
            self._direct_allreduce(inputs[0], outputs[0], op, prescale, postscale)
            return
        self._settle()
        per_chunk = self.seg.chunk // dtype.itemsize
        mine = self.seg.slot(self.rank, dtype)
        result = self.seg.result(dtype)
        barrier = self.comm.barrier
        for base in range(0, total, per_chunk):
            n = min(per_chunk, total - base)
            self.progress = base * dtype.itemsize
            with activity("MEMCPY_IN_FUSION_BUFFER"):     # the shared segment is the fusion buffer
                if len(inputs) == 1:
                    scaled_copy(mine[:n], inputs[0][base:base + n], prescale)
                else:
                    _copy_from_list(inputs, base, mine[:n], prescale)
            with activity("SHM_ALLREDUCE"):
                barrier()
                lo, hi = _segment(n, self.size, self.rank, dtype.itemsize)
                if hi > lo:
                    self._reduce_segment(lo, hi, dtype, op, result[lo:hi])
                barrier()
            with activity("MEMCPY_OUT_FUSION_BUFFER"):
                if len(outputs) == 1:
                    scaled_copy(outputs[0][base:base + n], result[:n], postscale)
                else:
                    _copy_to_list(result[:n], outputs, base, postscale)

    def _small_allreduce(self, inputs, outputs, total, dtype, op, prescale, postscale) -> None:
        """One barrier instead of two: every rank reduces the whole (small) buffer itself, in rank order.

        Slots alternate between two halves from call to call, so a rank that races ahead into the next small
        allreduce writes the half its slower peers are not reading; it cannot get two calls ahead, because
        the next call's barrier waits for them.
        """
        base = self._small_half(dtype)
        slots = [self.seg.slot(r, dtype)[base:base + total] for r in range(self.size)]
        with activity("MEMCPY_IN_FUSION_BUFFER"):
            if len(inputs) == 1:
                scaled_copy(slots[self.rank], inputs[0], prescale)
            else:
                _copy_from_list(inputs, 0, slots[self.rank], prescale)
        with activity("SHM_ALLREDUCE"):
            self.comm.barrier()
            acc = self.fusion_buffer(total, dtype)
            if self.size == 1:
                np.copyto(acc, slots[0])
            else:
                combine(acc, slots[0], slots[1], op)
                for r in range(2, self.size):
                    reduce_into(acc, slots[r], op)
        with activity("MEMCPY_OUT_FUSION_BUFFER"):
            if len(outputs) == 1:
                scaled_copy(outputs[0], acc, postscale)
            else:
                _copy_to_list(acc, outputs, 0, postscale)

    def allreduce_buffer(self, buf: np.ndarray, op: ReduceOp) -> None:
        self.allreduce([buf], [buf], op)

    # ------------------------------------------------------------- other collectives
    def allgatherv(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
        dtype = inp.dtype
        starts = offsets(counts)
        lo, hi = DIRECT_ALLGATHER_BYTES
        if self.direct and lo <= out.nbytes <= hi and out.flags.c_contiguous:
            self._direct_allgather(inp, out, counts, starts)
            return
        if max(counts) * dtype.itemsize <= self.small_bytes:
            base = self._small_half(dtype)
            np.copyto(self.seg.slot(self.rank, dtype)[base:base + counts[self.rank]], inp)
            self.comm.barrier()
            for r in range(self.size):
                np.copyto(out[starts[r]:starts[r] + counts[r]], self.seg.slot(r, dtype)[base:base + counts[r]])
            return
        self._settle()
        per = self.seg.chunk // dtype.itemsize
        mine = self.seg.slot(self.rank, dtype)
        for base in range(0, max(counts), per):
            k = max(0, min(per, counts[self.rank] - base))
            if k:
                np.copyto(mine[:k], inp[base:base + k])
            self.comm.barrier()
            for r in range(self.size):
                kr = max(0, min(per, counts[r] - base))
                if kr:
                    np.copyto(out[starts[r] + base:starts[r] + base + kr], self.seg.slot(r, dtype)[:kr])
            self.comm.barrier()

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        if self.size == 1:
            return
        dtype = buf.dtype
        if self.direct and buf.nbytes >= DIRECT_BROADCAST_BYTES:
            self._direct_broadcast(buf, root)
            return
        if buf.nbytes <= self.small_bytes:
            base = self._small_half(dtype)
            slot = self.seg.slot(root, dtype)[base:base + buf.size]
            if self.rank == root:
                np.copyto(slot, buf)
            self.comm.barrier()
            if self.rank != root:
                np.copyto(buf, slot)
            return
        self._settle()
        # Pipelined through the two halves of the root's slot: while the others copy chunk i out of one half,
        # the root copies chunk i + 1 into the other, so a step costs the longer of the two copies, not both.
        half = max(1, self.seg.chunk // 2 // dtype.itemsize)
        slot = self.seg.slot(root, dtype)
        halves = (slot[:half], slot[half:2 * half])
        starts = list(range(0, buf.size, half))
        if self.rank == root:
            np.copyto(halves[0][:min(half, buf.size)], buf[:half])
        self.comm.barrier()
        for step, base in enumerate(starts):
            n = min(half, buf.size - base)
            if self.rank == root:
                if step + 1 < len(starts):
                    nxt = starts[step + 1]
                    np.copyto(halves[(step + 1) % 2][:min(half, buf.size - nxt)], buf[nxt:nxt + half])
            else:
                np.copyto(buf[base:base + n], halves[step % 2][:n])
            self.comm.barrier()

    # ------------------------------------------------------------ cross-memory paths
    def _publish(self, array: np.ndarray, output: Optional[np.ndarray] = None) -> List[Tuple[int, int]]:
        """Show the peers where ``array`` lies (and ``output``, see :meth:`_output_addresses`); returns every
        rank's (pid, address) once all have published.

        The caller must end its op with a barrier, so that ``array`` stays put while the peers copy, and the
        records are not overwritten by a next op before every rank has read them here.
        """
        mine = self.seg.record(self.rank)
        at = cma.shared_address(array)
        mine[ADDRESS], mine[NBYTES] = at, array.nbytes
        if output is not None:
            mine[OUT_ADDRESS] = cma.shared_address(output, besides=at)
        self.comm.barrier()
        return [(int(rec[PID]), int(rec[ADDRESS])) for rec in map(self.seg.record, range(self.size))]

    def _output_addresses(self) -> List[int]:
        """Every rank's published output (after :meth:`_publish` with one)."""
        return [int(self.seg.record(r)[OUT_ADDRESS]) for r in range(self.size)]

    def _direct_allreduce(self, inp: np.ndarray, out: np.ndarray, op: ReduceOp, prescale: float,
                          postscale: float) -> None:
        """Allreduce of one tensor by cross-memory copies: this rank reduces its 1/size (the chunked path's
        cache-line aligned split), reading that part of every peer's input piece by piece, in rank order with the
        chunked path's kernels and scale factors (the same bits), and writes each reduced piece into every peer's
        output while it is in the cache. Only this rank reads its part of any input, and it reads a piece before
        anyone writes it, so an allreduce in place is safe; a rank from 2 on keeps its own piece aside first,
        because the first combine writes the output before its turn. A tensor that is not contiguous goes
        through a contiguous copy."""
        flat_in = (inp if inp.flags.c_contiguous else np.ascontiguousarray(inp)).reshape(-1)
        staged = not out.flags.c_contiguous
        flat_out = np.empty(out.size, out.dtype) if staged else out.reshape(-1)
        itemsize = flat_in.dtype.itemsize
        where = self._publish(flat_in, flat_out)
        outputs = self._output_addresses()
        lo, hi = _segment(flat_in.size, self.size, self.rank, itemsize)
        piece = max(1, DIRECT_PIECE_BYTES // itemsize)
        parts = self.scratch("direct-allreduce", self.size * min(piece, max(1, hi - lo)), flat_in.dtype)

        def read(r: int, start: int, part: np.ndarray) -> None:
            self.progress = start * itemsize        # how far this rank got, for the data-plane watchdog
            self._cross(r, cma.read, where[r][0], where[r][1] + (lo + start) * itemsize, part)

        def write(r: int, start: int, reduced: np.ndarray) -> None:
            self._cross(r, cma.write, where[r][0], outputs[r] + (lo + start) * itemsize, reduced)

        with activity("SHM_ALLREDUCE"):
            reduce_pieces(self.rank, self.size, flat_in[lo:hi], flat_out[lo:hi], op, prescale, postscale, piece,
                          lambda i, n: parts[i * n:(i + 1) * n], read, write)
        self.comm.barrier()
        if staged:
            np.copyto(out, flat_out.reshape(out.shape))

    def _cross(self, peer: int, copy, *args) -> None:
        """One cross-memory copy with ``peer``; a failure (the peer exited) is reported as the peer lost."""
        try:
            copy(*args)
        except cma.CrossMemoryError as exc:
            raise PeerLostError(self.comm.global_ranks[peer], self.comm.hosts[peer], str(exc)) from None

    def _direct_broadcast(self, buf: np.ndarray, root: int) -> None:
        """Broadcast with one copy, split so that every rank copies as much: the root writes the first 1/size
        of the buffer into each peer, and each peer reads the rest from the root."""
        target = buf if buf.flags.c_contiguous else self.scratch("direct", buf.size, buf.dtype)
        if target is not buf and self.rank == root:
            np.copyto(target, buf)
        where = self._publish(target)
        raw = target.reshape(-1).view(np.uint8)
        head = cma.root_share(raw.nbytes, self.size)
        with activity("SHM_CROSS_MEMORY_READ"):
            if self.rank == root:
                for r in range(self.size):
                    if r != root and head:
                        self._cross(r, cma.write, where[r][0], where[r][1], raw[:head])
            else:
                self._cross(root, cma.read, where[root][0], where[root][1] + head, raw[head:])
        self.comm.barrier()
        if target is not buf and self.rank != root:
            np.copyto(buf, target)

    def _direct_allgather(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int],
                          starts: Sequence[int]) -> None:
        """Allgather with one copy: each rank places its own block, then reads every peer's block straight from
        the peer's input (``process_vm_readv``), starting with the next rank's so that no two readers start on
        the same block."""
        source = inp if inp.flags.c_contiguous else np.ascontiguousarray(inp)
        where = self._publish(source)
        flat = out.reshape(-1)
        with activity("SHM_CROSS_MEMORY_READ"):
            mine = flat[starts[self.rank]:starts[self.rank] + counts[self.rank]]
            np.copyto(mine, source.reshape(-1))
            for step in range(1, self.size):
                r = (self.rank + step) % self.size
                if counts[r]:
                    block = flat[starts[r]:starts[r] + counts[r]]
                    self._cross(r, cma.read, where[r][0], where[r][1], block)
        self.comm.barrier()

    def _region(self, owner: int, dest: int, dtype) -> np.ndarray:
        per = (self.seg.chunk // self.size) // ALIGN * ALIGN // np.dtype(dtype).itemsize
        return self.seg.slot(owner, dtype)[dest * per:(dest + 1) * per]

    def alltoallv(self, inp: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                  recv_counts: Sequence[int], max_count: int = 0) -> None:
        dtype = inp.dtype
        per = self._region(0, 0, dtype).size
        if per == 0:
            raise ValueError("HOROVOD_SHM_CHUNK_BYTES is too small for this many local ranks")
        sstarts, rstarts = offsets(send_counts), offsets(recv_counts)
        self._settle()
        for base in range(0, max(max_count, 1), per):
            for dst in range(self.size):
                k = max(0, min(per, send_counts[dst] - base))
                if k:
                    np.copyto(self._region(self.rank, dst, dtype)[:k],
                              inp[sstarts[dst] + base:sstarts[dst] + base + k])
            self.comm.barrier()
            for src in range(self.size):
                k = max(0, min(per, recv_counts[src] - base))
                if k:
                    np.copyto(out[rstarts[src] + base:rstarts[src] + base + k],
                              self._region(src, self.rank, dtype)[:k])
            self.comm.barrier()

    def reducescatter(self, inp: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
        dtype = inp.dtype
        per = self._region(0, 0, dtype).size
        starts = offsets(counts)
        self._settle()
        for base in range(0, max(counts), per):
            for dst in range(self.size):
                k = max(0, min(per, counts[dst] - base))
                if k:
                    np.copyto(self._region(self.rank, dst, dtype)[:k], inp[starts[dst] + base:starts[dst] + base + k])
            self.comm.barrier()
            k = max(0, min(per, counts[self.rank] - base))
            if k:
                dst = out[base:base + k]
                if self.size == 1:
                    np.copyto(dst, self._region(0, 0, dtype)[:k])
                else:
                    combine(dst, self._region(0, self.rank, dtype)[:k], self._region(1, self.rank, dtype)[:k], op)
                    for r in range(2, self.size):
                        reduce_into(dst, self._region(r, self.rank, dtype)[:k], op)
            self.comm.barrier()

    def barrier(self) -> None:
        self._readers_pending = False
        self.comm.barrier()

    def fast_area(self) -> np.ndarray:
        """The shared bytes of the engine's fast rounds, the same on every local rank."""
        return self.seg.fast_area()

    def cross_memory_pids(self) -> Optional[List[int]]:
        """Every local rank's process id, by rank, where all of them may copy to and from each other's memory
        (the fast rounds' direct copies), else None."""
        if not self.direct:
            return None
        return [int(self.seg.record(r)[PID]) for r in range(self.size)]

    def close(self) -> None:
        self.seg.close()
        self.comm.close()
