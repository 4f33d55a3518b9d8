"""The floor of the one-host collectives: the four ops in plain Python and numpy through shared memory, with none
of a library's work (no engine thread, no negotiation, no handles, no checks, no names), so that what any Python
implementation pays on this host (the interpreter's own steps, a cache line's trip between cores, the copies) is
measured beside ours and Open MPI's in the same run (``benchmarks/collectives.py --peers ...,pyshm``).

Every rank owns a 64-byte line of round counters and two slots (even and odd rounds) in one shared file. A round
copies the rank's input into its slot, publishes the round number, spins until the peers it reads have published
theirs, and reads their slots: an allgather copies every slot into its output, an allreduce adds them in rank
order, a reducescatter adds the rank's own block of each, a broadcast's other ranks copy the root's slot. That is
two copies per byte (what Open MPI's shared-memory transport does below its single-copy sizes). A slot is written
again two rounds later, once every peer has published the round in between, which it does only after it has read
the slot: in a loop of blocking calls that has always happened already (but for a broadcast's root, which reads
nobody and so checks). x86-64 keeps stores, and loads, in program order: the data is visible before the count.

Run under ``horovodrun`` (rank and size from its environment); ``DIR`` is a fresh directory on a tmpfs that the
caller removes afterwards:

    python -m benchmarks.workers.shm_floor OUT.json SIZES DIR
"""
from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from horovod.bench.peers import _counts

LINE = 64                       # bytes: one rank's counter, alone on its cache line
WORD = LINE // 8                # uint64 words per line
_NOTHING = np.empty(0, np.uint8)


class Segment:
    """One shared file mapped by every rank: ``size`` counter lines, then two slots of ``slot_bytes`` per rank.

    Every rank opens (creating it if it is first) and sizes the same file: extending a new file fills it with
    zeros, and sizing it again to the same length changes nothing, so no rank needs to go first."""

    def __init__(self, path: Path, rank: int, size: int, slot_bytes: int) -> None:
        self.rank, self.size, self.slot_bytes = rank, size, slot_bytes
        total = size * LINE + size * 2 * slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, total)
            self._map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, np.uint8)
        self.words = memoryview(self._map)[:size * LINE].cast("Q")     # plain ints: cheaper than numpy's
        base = size * LINE
        self.slots = [[self.array[base + (2 * r + b) * slot_bytes:base + (2 * r + b + 1) * slot_bytes]
                       for b in range(2)] for r in range(size)]

    def posted(self, rank: int) -> int:
        return self.words[rank * WORD]

    def post(self, k: int) -> None:
        self.words[self.rank * WORD] = k

    def close(self) -> None:
        """Drop this rank's views; the mapping goes once nothing refers to it (a timed call may, until the sweep
        moves on)."""
        self.slots, self.array = [], None


class ShmFloor:
    """The four ops on one :class:`Segment`; ``oversubscribed`` (more ranks than cores) yields the core while it
    spins, so that the peer it waits for can run."""

    def __init__(self, segment: Segment, oversubscribed: bool = False) -> None:
        self.seg = segment
        self.rank, self.size = segment.rank, segment.size
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.count = 0
        self.oversubscribed = oversubscribed

    def _wait(self, ranks: List[int], k: int) -> None:
        posted, pause = self.seg.posted, self.oversubscribed
        for r in ranks:
            while posted(r) < k:
                if pause:
                    os.sched_yield()

    def _round(self, data: np.ndarray, writes: bool) -> tuple:
        """Start the next round: wait until the slot it reuses is read, copy ``data`` in (if ``writes``), post."""
        k = self.count = self.count + 1
        b = k % 2
        if writes:
            self._wait(self.peers, k - 1)
            self.seg.slots[self.rank][b][:data.nbytes].view(data.dtype)[:] = data
        self.seg.post(k)
        return k, b

    def _slots(self, b: int, start: int, count: int, dtype: np.dtype) -> List[np.ndarray]:
        itemsize = np.dtype(dtype).itemsize
        return [self.seg.slots[r][b][start * itemsize:(start + count) * itemsize].view(dtype)
                for r in range(self.size)]

    def allreduce(self, x: np.ndarray, out: np.ndarray) -> None:
        k, b = self._round(x, True)
        self._wait(self.peers, k)
        _sum(self._slots(b, 0, x.size, x.dtype), out)

    def reducescatter(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out`` (this rank's block: ``x.size / size`` elements) is the sum of every rank's block ``rank``."""
        k, b = self._round(x, True)
        self._wait(self.peers, k)
        _sum(self._slots(b, self.rank * out.size, out.size, x.dtype), out)

    def allgather(self, x: np.ndarray, out: np.ndarray) -> None:
        k, b = self._round(x, True)
        self._wait(self.peers, k)
        for r, slot in enumerate(self._slots(b, 0, x.size, x.dtype)):
            out[r * x.size:(r + 1) * x.size] = slot

    def broadcast(self, x: np.ndarray, root: int = 0) -> None:
        k, b = self._round(x, self.rank == root)
        if self.rank != root:
            self._wait([root], k)
            x[:] = self._slots(b, 0, x.size, x.dtype)[root]

    def barrier(self) -> None:
        """Every rank's next round, with nothing copied."""
        k, _ = self._round(_NOTHING, False)
        self._wait(self.peers, k)


def _sum(slots: List[np.ndarray], out: np.ndarray) -> None:
    """The slots added in rank order into ``out``."""
    if len(slots) == 1:
        out[:] = slots[0]
        return
    np.add(slots[0], slots[1], out=out)
    for slot in slots[2:]:
        np.add(out, slot, out=out)


def runs(floor: ShmFloor, nbytes: int) -> Dict[str, Callable[[], None]]:
    """The calls timed at ``nbytes``, on float32 buffers sized as ``horovod.bench.peers`` sizes every peer's."""
    count, part = _counts(nbytes, floor.size)
    x, y, piece = np.ones(count, np.float32), np.empty(count, np.float32), np.ones(part, np.float32)
    return {"allreduce": lambda: floor.allreduce(x, y),
            "allgather": lambda: floor.allgather(piece, y),
            "broadcast": lambda: floor.broadcast(x),
            "reducescatter": lambda: floor.reducescatter(x, piece)}


def main(out: str, sizes: List[int], directory: str) -> None:
    from benchmarks.workers.timing import sweep, write

    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    oversubscribed = size > (os.cpu_count() or 1)
    control = ShmFloor(Segment(Path(directory) / "control", rank, size, 0), oversubscribed)
    floors: Dict[int, ShmFloor] = {}

    def make_runs(nbytes: int) -> Dict[str, Callable[[], None]]:
        control.barrier()           # the previous size's segment is no longer used by anyone
        for old in floors.values():
            old.seg.close()
        floors.clear()
        path = Path(directory) / f"data-{nbytes}"
        slot_bytes = 4 * _counts(nbytes, size)[0]          # the whole float32 buffer of an allreduce
        floors[nbytes] = floor = ShmFloor(Segment(path, rank, size, slot_bytes), oversubscribed)
        control.barrier()           # everyone has it mapped: its memory goes with the last mapping
        if rank == 0:
            path.unlink()
        return runs(floor, nbytes)

    rows = sweep("pyshm", sizes, make_runs, control.barrier, rank, size)
    control.barrier()
    if rank == 0:
        write(out, rows)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3])
